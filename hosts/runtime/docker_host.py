"""Docker on one machine, spoken over the pooled SSH connection: start, stop, inspect and
remove containers, read their logs, pull images (private registries' logins never in an
argv), and keep the platform's bridge networks, the tenants' one with inter-container
communication off. Every command is built from a checked ``ContainerSpec`` or a checked
reference; why a ``docker run`` failed is told by its exit status, not its wording.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hosts import ssh
from hosts.runtime.container_spec import (
    CONTAINER_REF,
    MACHINE_LABEL,
    NETWORK_NAME,
    PLATFORM_LABEL,
    TENANT_NETWORK,
    ContainerSpec,
    InvalidContainerSpec,
    docker_run_argv,
    image_reference,
    validate_image,
)
from hosts.runtime.firewall import (
    BRIDGE_NAME_OPTION,
    BRIDGE_PREFIX,
    is_platform_bridge,
    new_bridge_name,
)
from hosts.runtime.mps import mps_daemon_start_argv, mps_daemon_stop_argv
from hosts.runtime.registries import registry_of
from hosts.runtime.volumes import HostVolumes
from hosts.ssh import CommandFailed, CommandResult

if TYPE_CHECKING:
    from hosts.models import Machine

# The tenants' network (TENANT_NETWORK, where its isolation is explained) is made with this
# option false: Docker then drops traffic between two containers on it.
ICC_OPTION = "com.docker.network.bridge.enable_icc"
# Only one launch at a time may create a network on a host: Docker's duplicate-name check is
# not atomic, and two networks of one name make every `--network` by that name fail. The
# lock file is in the SSH user's home, where no other user of the host can plant it. $1 the
# name, $2 the format that prints its bridge, then the create command. Under the lock, a
# network of the name on a bridge the tenant firewall covers is kept; one made before the
# firewall is removed and made again when no container uses it (else kept, as it is).
_NETWORK_CREATE = (
    'n=$1; f=$2; shift 2; exec 9>>"$HOME/.gpumkt-network.lock" || exit 1; '
    "if command -v flock >/dev/null; then flock 9; fi; "
    'if b=$(docker network inspect --format "$f" "$n" 2>/dev/null); then '
    f'case "$b" in {BRIDGE_PREFIX}*) exit 0;; esac; '
    'docker network rm "$n" >/dev/null 2>&1 || exit 0; fi; exec "$@"'
)
_BRIDGE_FORMAT = f'{{{{index .Options "{BRIDGE_NAME_OPTION}"}}}}'

# A platform network found (or made) isolated on a machine is trusted by this process's
# launches there by its id, instead of asked about before every `docker run` (a second Docker
# command per launch, a large share of a launch's time). Launches name the network by that
# id: one removed or re-made meanwhile (a re-made one has a new id, whatever it allows) fails
# the run at its start (exit 125), and the launch checks the network again and runs once more.
_networks_checked: dict[tuple[int, str, int, str], str] = {}

# What `docker run` exits with (Docker's documented codes): 125 the daemon refused (no such
# image under --pull=never, a port taken, a name in use); 126 the command cannot be invoked;
# 127 the command is not found. The container exists (Created) after a 126 or 127.
EXIT_DOCKER_ERROR, EXIT_CANNOT_INVOKE, EXIT_NOT_FOUND = 125, 126, 127
# The program Docker names in a failed start: `exec: "1": executable file not found in $PATH`.
_EXEC_PROGRAM = re.compile(r'exec: "((?:[^"\\]|\\.){1,255})"')


class ImageNotOnHost(CommandFailed):
    """``docker run --pull=never`` failed and the image is not on the machine: pull it."""


class ContainerDidNotStart(CommandFailed):
    """The container was made but its command could not run (not found, not executable):
    no pull can help; ``reason`` says what the renter must change."""

    def __init__(self, argv: list[str], exit_code: int, stderr: str, reason: str):
        super().__init__(argv, exit_code, stderr)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason} (docker run exited {self.exit_code})"


class RegistryLoginRefused(CommandFailed):
    """``docker login`` failed: the registry refused the renter's login, or could not be
    reached to ask. Said in the API's words, since the renter must change what they gave."""

    def __init__(self, argv: list[str], exit_code: int, stderr: str, registry: str):
        super().__init__(argv, exit_code, stderr)
        self.registry = registry

    def __str__(self) -> str:
        said = self.stderr.strip().splitlines()[-1][:300] if self.stderr.strip() else ""
        # Refused or unreachable: Docker's own words (last line) tell which.
        return (
            f"could not log in to the registry {self.registry} with the login given as "
            f"registry_username and registry_password "
            f"({said or f'docker login exited {self.exit_code}'})"
        )


def _logged_in(credentials: tuple[str, str], registry: str, then: str) -> tuple[list[str], bytes]:
    """(argv, stdin) of a shell that logs in to ``registry`` into a throwaway Docker config
    directory ``$dir``, removed on exit, and then runs ``then``. The password travels on
    stdin, never in an argv the host's other users could see."""
    user, password = credentials
    if not user or any(c in user for c in "\0\n\r"):
        raise InvalidContainerSpec("registry_username", "a user name on one line")
    script = (
        "dir=$(mktemp -d) && trap 'rm -rf \"$dir\"' EXIT && "
        'docker --config "$dir" login --username "$1" --password-stdin "$2" >/dev/null '
        f"&& {then}"
    )
    return ["sh", "-c", script, "sh", user, registry], password.encode()


def _inside_firewall(found: tuple[str, str, dict[str, str]]) -> bool:
    """Whether a network's bridge is one the host's tenant firewall matches (one made before
    the firewall is not, and is made again when no container uses it)."""
    return is_platform_bridge(found[2].get(BRIDGE_NAME_OPTION, ""))


def _on_network(argv: list[str], network_id: str) -> list[str]:
    """``docker run`` argv naming its network by the id that was checked, not by name."""
    at = argv.index("--network") + 1
    return [*argv[:at], network_id, *argv[at + 1 :]]


class NetworkNotIsolated(ValueError):
    """The machine has a network of the tenants' name that lets containers reach each other."""


@dataclass(frozen=True)
class ContainerState:
    id: str
    name: str
    state: str  # created, running, exited, paused, dead, …
    status: str  # "Up 3 minutes", "Exited (0) 2 seconds ago"
    instance: str

    @property
    def running(self) -> bool:
        return self.state in ("running", "restarting")

    @property
    def paused(self) -> bool:
        return self.state == "paused"


# A container's full id, as `docker run -d` prints it and the instance records it.
_FULL_ID = re.compile(r"^[0-9a-f]{64}$")


def _container_ref(ref: str) -> str:
    if not CONTAINER_REF.fullmatch(ref or ""):
        raise InvalidContainerSpec("container", f"'{str(ref)[:40]}' is not a container id or name")
    return ref


class DockerHost:
    """Docker on one machine, over the pooled SSH connection."""

    def __init__(self, machine: Machine):
        self.machine = machine

    def _run(
        self, argv: list[str], *, timeout: float = ssh.COMMAND_TIMEOUT, check: bool = True
    ) -> CommandResult:
        return ssh.run(self.machine, argv, timeout=timeout, check=check)

    def run(self, spec: ContainerSpec, *, pull: bool = True) -> str:
        """Start the container on its network (made first when the machine lacks it).

        ``pull=False`` fails fast with ImageNotOnHost instead of pulling silently, so the
        caller can pull with progress. A command the image cannot run raises
        ContainerDidNotStart (the container is left Created, for the caller to remove).
        Told apart by docker's exit status and the image's presence, not by its wording.
        """
        argv = docker_run_argv(
            spec, machine_id=self.machine.pk, nvidia_runtime=self.machine.nvidia_runtime
        )
        if not pull:
            argv.insert(argv.index("--detach"), "--pull=never")
        trusted = _networks_checked.get(self._network_key(spec.network))
        network_id = trusted or self._network_checked(spec.network)
        if spec.gpu_slice is not None:
            self.mps_daemon_ensure()  # its pipe directory is the slice's mount source
        self.volumes_ensure([name for name, _ in spec.volumes])
        try:
            return self._run(_on_network(argv, network_id)).stdout.strip()
        except CommandFailed as error:
            if not (trusted and error.exit_code == EXIT_DOCKER_ERROR):
                raise self._why_not_started(spec, error, pulled=pull) from error
            network_id = self._network_checked(spec.network)
            if network_id == trusted:
                raise self._why_not_started(spec, error, pulled=pull) from error
        # The network was removed or made again: it is checked (made again, isolated, where
        # it was gone) and the run tried once more. The refused run left its container made
        # but never started; a plain `docker rm` removes that one and never a running
        # container of the name (another launcher's, adopted).
        self._run(["docker", "rm", _container_ref(spec.name)], check=False)
        try:
            return self._run(_on_network(argv, network_id)).stdout.strip()
        except CommandFailed as error:
            raise self._why_not_started(spec, error, pulled=pull) from error

    def _why_not_started(
        self, spec: ContainerSpec, error: CommandFailed, *, pulled: bool
    ) -> CommandFailed:
        if error.exit_code in (EXIT_CANNOT_INVOKE, EXIT_NOT_FOUND):
            named = _EXEC_PROGRAM.search(error.stderr)
            program = named.group(1) if named else (spec.entrypoint or "the image's command")
            if error.exit_code == EXIT_NOT_FOUND:
                reason = f"executable '{program}' not found in the image"
            else:
                reason = f"'{program}' cannot be run in the image (not an executable file)"
            return ContainerDidNotStart(error.argv, error.exit_code, error.stderr, reason)
        if (
            error.exit_code == EXIT_DOCKER_ERROR
            and not pulled
            and not self.image_present(image_reference(spec.image))
        ):
            return ImageNotOnHost(error.argv, error.exit_code, error.stderr)
        return error

    def volumes_ensure(self, names: list[str]) -> None:
        """The enforced-size volumes a container mounts, mounted on the host (again, after a
        reboot) before it runs or starts."""
        for name in names:
            HostVolumes(self.machine).ensure_mounted(name)

    def mps_daemon_ensure(self) -> None:
        """Start the host's CUDA MPS control daemon unless it answers already (sharing turned
        on, a slice about to launch, a host rebooted since)."""
        self._run(mps_daemon_start_argv())

    def mps_daemon_stop(self) -> None:
        self._run(mps_daemon_stop_argv())

    def network_ensure(self, name: str) -> bool:
        """Make the platform network ``name`` unless the machine has it; idempotent, and safe
        for launches racing on one host (they take turns under a lock file on the host).
        True when it had to be made.

        The tenants' network is made with inter-container communication off and refused
        (NetworkNotIsolated) if one of its name exists that lets containers talk. Each is
        made on a bridge the host's tenant firewall covers (``hosts.runtime.firewall``); one
        made before the firewall is made again once no container uses it.
        """
        if not NETWORK_NAME.fullmatch(name or ""):
            raise InvalidContainerSpec("network", f"'{str(name)[:40]}' is not a platform network")
        _networks_checked.pop(self._network_key(name), None)
        found = self._network_options(name)
        made = False
        if found is None or not _inside_firewall(found):
            create = ["docker", "network", "create", "--driver", "bridge",
                      "--label", f"{PLATFORM_LABEL}=1",
                      "--opt", f"{BRIDGE_NAME_OPTION}={new_bridge_name()}"]  # fmt: skip
            if name == TENANT_NETWORK:
                create += ["--opt", f"{ICC_OPTION}=false"]
            self._run(["sh", "-c", _NETWORK_CREATE, "sh", name, _BRIDGE_FORMAT, *create, name])
            before, found = found, self._network_options(name)
            if found is None:
                raise CommandFailed(["docker", "network"], 1, f"network {name} was not made")
            made = before is None or _inside_firewall(found)
        network_id, driver, options = found
        if name == TENANT_NETWORK and (driver != "bridge" or options.get(ICC_OPTION) != "false"):
            raise NetworkNotIsolated(
                f"the machine's network {name} lets containers reach each other; the provider "
                f"must remove it (docker network rm {name}) for the platform to make it again"
            )
        _networks_checked[self._network_key(name)] = network_id
        return made

    def _network_checked(self, name: str) -> str:
        """The id of the platform network ``name``, made or checked isolated just now."""
        self.network_ensure(name)
        return _networks_checked[self._network_key(name)]

    def _network_key(self, name: str) -> tuple[int, str, int, str]:
        return (self.machine.pk, self.machine.address, self.machine.port, name)

    def _network_options(self, name: str) -> tuple[str, str, dict[str, str]] | None:
        """(id, driver, options) of the network ``name``, or None when the machine has none."""
        result = self._run(
            ["docker", "network", "inspect", "--format", "{{json .}}", name], check=False
        )
        if result.exit_code != 0:
            return None
        network = json.loads(result.stdout.splitlines()[0])
        return network.get("Id", ""), network.get("Driver", ""), network.get("Options") or {}

    def network_remove(self, name: str) -> bool:
        """Remove a group's network once no container uses it; True when it is gone. The
        tenants' network is shared by every rental on the machine and stays."""
        if name == TENANT_NETWORK or not NETWORK_NAME.fullmatch(name or ""):
            raise InvalidContainerSpec("network", f"'{str(name)[:40]}' is not a group network")
        _networks_checked.pop(self._network_key(name), None)
        self._run(["docker", "network", "rm", name], check=False)
        return self._network_options(name) is None

    def stop(self, container: str, *, grace_seconds: int = 10) -> None:
        self._run(
            ["docker", "stop", "--time", str(grace_seconds), _container_ref(container)],
            timeout=grace_seconds + 60,
        )

    def start(self, container: str) -> None:
        self._run(["docker", "start", _container_ref(container)])

    def commit(self, container: str, image: str) -> str:
        """``docker commit`` the container as ``image`` (a full reference with a tag); the
        container keeps running (paused for the moment of the commit, Docker's default)."""
        validate_image(image)
        return self._run(
            ["docker", "commit", _container_ref(container), image], timeout=600
        ).stdout.strip()

    def pause(self, container: str) -> None:
        """Freeze every process of the container (the cgroup freezer); memory stays."""
        self._run(["docker", "pause", _container_ref(container)])

    def unpause(self, container: str) -> None:
        self._run(["docker", "unpause", _container_ref(container)])

    def restart(self, container: str, *, grace_seconds: int = 10) -> None:
        self._run(
            ["docker", "restart", "--time", str(grace_seconds), _container_ref(container)],
            timeout=grace_seconds + 60,
        )

    def remove(self, container: str) -> None:
        self._run(["docker", "rm", "--force", "--volumes", _container_ref(container)])

    def container_id(self, ref: str) -> str:
        """The full id of the container ``ref`` (an id or a name), or "" when Docker answers
        that it has none. Raises CommandFailed (or HostUnreachable) when Docker does not
        answer: a failed ``docker inspect`` cannot tell "no such container" from "the daemon
        is down" but by its wording, while ``docker ps`` answers an empty list with exit 0."""
        ref = _container_ref(ref)
        if _FULL_ID.fullmatch(ref):
            wanted = f"id={ref}"
        else:
            wanted = "name=^/" + ref.replace(".", "\\.") + "$"  # an exact name, not a part
        result = self._run(
            ["docker", "ps", "--all", "--no-trunc", "--filter", wanted, "--format", "{{.ID}}"]
        )
        return result.stdout.split()[0] if result.stdout.split() else ""

    def inspect(self, container: str) -> dict:
        result = self._run(["docker", "container", "inspect", _container_ref(container)])
        return json.loads(result.stdout)[0]

    def logs(self, container: str, *, tail: int = 200) -> str:
        # Containers write to stdout and stderr; read both, interleaved as they were written.
        argv = [
            "sh",
            "-c",
            'exec docker logs --tail "$1" "$2" 2>&1',
            "sh",
            str(int(tail)),
            _container_ref(container),
        ]
        return self._run(argv).stdout

    def logs_follow(
        self,
        container: str,
        *,
        tail: int = 50,
        timeout: float = 3600,
        on_channel: Callable[[object], None] | None = None,
    ) -> Iterator[str]:
        """The log's last ``tail`` lines, then each new one; ``on_channel`` gets the SSH
        channel, whose closing (from any thread) ends the stream at once."""
        argv = ["docker", "logs", "--follow", "--tail", str(int(tail)), _container_ref(container)]
        return ssh.pool.stream(self.machine, argv, timeout=timeout, on_channel=on_channel)

    def exec(self, container: str, argv: list[str], *, timeout: float = 60) -> CommandResult:
        return self._run(
            ["docker", "exec", _container_ref(container), *argv], timeout=timeout, check=False
        )

    def list_platform_containers(
        self, labels: dict[str, str] | None = None
    ) -> list[ContainerState]:
        """All of the platform's containers on this machine, in one command; with ``labels``,
        only those that carry them too (the installation's own, where several share a host)."""
        fmt = '{{.ID}}\t{{.Names}}\t{{.State}}\t{{.Status}}\t{{.Label "gpumkt.instance"}}'
        argv = [
            "docker", "ps", "--all", "--no-trunc",
            "--filter", f"label={PLATFORM_LABEL}=1",
            "--filter", f"label={MACHINE_LABEL}={self.machine.pk}",
            "--format", fmt,
        ]  # fmt: skip
        for key, value in sorted((labels or {}).items()):
            argv[-2:-2] = ["--filter", f"label={key}={value}"]
        result = self._run(argv)
        states = []
        for line in result.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) == 5:
                states.append(ContainerState(*parts))
        return states

    def image_present(self, image: str) -> bool:
        validate_image(image)
        result = self._run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", image], check=False
        )
        return result.exit_code == 0

    def pull(
        self,
        image: str,
        *,
        progress_callback: Callable[[int, str], None] | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        """Pull an image, reporting 0-100 as its layers complete.

        With ``credentials`` (user, password) for a private registry, the login goes to a
        throwaway Docker config directory that is removed afterwards, and the password
        travels on stdin, never in an argv the host's other users could see.
        """
        validate_image(image)
        argv, stdin = ["docker", "pull", image], None
        if credentials is not None:
            argv, stdin = _logged_in(
                credentials, registry_of(image), 'docker --config "$dir" pull "$3"'
            )
            argv.append(image)
        layers: dict[str, bool] = {}
        for line in ssh.pool.stream(self.machine, argv, timeout=3600, stdin=stdin):
            layer, _, status = line.partition(": ")
            # "<tag>: Pulling from <repo>" names the tag, not a layer, even when the tag
            # looks like a layer id (a 12-character git SHA, say).
            if status.startswith("Pulling from"):
                continue
            if len(layer) == 12 and all(c in "0123456789abcdef" for c in layer):
                layers[layer] = status.startswith(("Pull complete", "Already exists"))
                if progress_callback and layers:
                    done = sum(layers.values())
                    progress_callback(
                        int(100 * done / len(layers)), f"Pulling image: {done}/{len(layers)} layers"
                    )

    def registry_login_check(self, image: str, credentials: tuple[str, str]) -> None:
        """Ask the registry of ``image`` whether it accepts ``credentials`` (user, password),
        with ``docker login`` into a throwaway config, as ``pull`` logs in; pulls nothing.
        Refused, or the registry not reached: RegistryLoginRefused."""
        validate_image(image)
        registry = registry_of(image)
        argv, stdin = _logged_in(credentials, registry, "true")
        try:
            for _line in ssh.pool.stream(self.machine, argv, timeout=120, stdin=stdin):
                pass
        except CommandFailed as error:
            raise RegistryLoginRefused(
                error.argv, error.exit_code, error.stderr, registry
            ) from None

    def volume_create(self, name: str) -> None:
        self._run(
            ["docker", "volume", "create", "--label", f"{PLATFORM_LABEL}=1", _container_ref(name)]
        )

    def volume_remove(self, name: str) -> None:
        self._run(["docker", "volume", "rm", "--force", _container_ref(name)])
