"""The Docker runtime, spoken over SSH.

``ContainerSpec`` is validated field by field (``InvalidContainerSpec`` names the field), and
``docker_run_argv`` is a pure function from a spec to an argv list. It can only produce the
flags written below: no ``--privileged``, no host networking (only the platform's own
``gpumkt-*`` bridge networks), no bind mounts (only named volumes, by ``--mount
type=volume``), no Docker socket, no renter ``NVIDIA_*`` variables. GPUs are pinned by UUID:
``--gpus`` where the NVIDIA runtime exists, else ``NVIDIA_VISIBLE_DEVICES``. Logs are capped.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.conf import settings

from hosts import ssh
from hosts.addresses import literal_ip, loopback_allowed
from hosts.ssh import CommandFailed, CommandResult, HostKeyMismatch, HostUnreachable

if TYPE_CHECKING:
    from hosts.models import Machine

__all__ = [
    "CommandFailed", "CommandResult", "ContainerDidNotStart", "ContainerSpec", "ContainerState",
    "DockerHost", "HostKeyMismatch", "HostUnreachable", "ImageNotOnHost", "InvalidContainerSpec",
    "NetworkNotIsolated", "TENANT_NETWORK", "docker_run_argv", "image_repository",
    "registry_refusal", "validate_env", "validate_image", "validate_ports", "validate_volumes",
]  # fmt: skip

PLATFORM_LABEL = "gpumkt.platform"
MACHINE_LABEL = "gpumkt.machine"
# Docker can cap a container's writable layer only on overlay2 over xfs with project quotas
# (--storage-opt size=…), which most hosts lack; the disk share is recorded, not enforced.
DISK_LABEL = "gpumkt.disk_gb"

# Every rental joins this bridge, made with inter-container communication off: Docker drops
# traffic between two containers on it, so one tenant cannot reach another's ports (a Jupyter,
# a database) on the same machine, while published ports still answer (they come in from the
# host). One network per machine rather than one per rental: Docker's default address pools
# hold only about 30 bridge networks per engine (measured: the 31st create fails), fewer than
# the rentals a big machine can hold. Containers that must talk to each other (a deployment's
# group) share a network of their own, any other ``gpumkt-*`` name, made with ICC on; Docker
# keeps separate bridges apart.
TENANT_NETWORK = "gpumkt-tenants"
_NETWORK = re.compile(r"^gpumkt-[a-z0-9][a-z0-9_.-]{0,100}$")
ICC_OPTION = "com.docker.network.bridge.enable_icc"
# Only one launch at a time may create a network on a host: Docker's duplicate-name check is
# not atomic, and two networks of one name make every `--network` by that name fail. The
# lock file is in the SSH user's home, where no other user of the host can plant it.
_NETWORK_CREATE = (
    'n=$1; shift; exec 9>>"$HOME/.gpumkt-network.lock" || exit 1; '
    "if command -v flock >/dev/null; then flock 9; fi; "
    'docker network inspect "$n" >/dev/null 2>&1 || exec "$@"'
)

# json-file logs are kept in full by default: a container printing forever fills the
# provider's disk (and its co-tenants' with it). 3 files of 10 MiB keep the last 20-30 MiB,
# enough for `docker logs --tail` and a crash's story; Docker rotates and drops the oldest.
LOG_MAX_KB = 10 * 1024
LOG_MAX_FILES = 3

# What `docker run` exits with (Docker's documented codes): 125 the daemon refused (no such
# image under --pull=never, a port taken, a name in use); 126 the command cannot be invoked;
# 127 the command is not found. The container exists (Created) after a 126 or 127.
EXIT_DOCKER_ERROR, EXIT_CANNOT_INVOKE, EXIT_NOT_FOUND = 125, 126, 127
# The program Docker names in a failed start: `exec: "1": executable file not found in $PATH`.
_EXEC_PROGRAM = re.compile(r'exec: "((?:[^"\\]|\\.){1,255})"')

# Docker's reference grammar: [registry[:port]/]path[:tag][@digest], lower-case path.
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{{1,5}})?/)?"
    rf"{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[a-f0-9]{{64}})?$"
)
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_LABEL_KEY = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$")
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# As nvidia-smi prints them: GPU-<uuid>, MIG-<uuid>, or the older MIG-GPU-<uuid>/<gi>/<ci>.
GPU_UUID = re.compile(rf"(?:GPU|MIG)-{_UUID}|MIG-GPU-{_UUID}/[0-9]{{1,3}}/[0-9]{{1,3}}")
_GPU_UUID = GPU_UUID
_CONTAINER_REF = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$")
PROGRAM_NAME = re.compile(r"^[A-Za-z0-9_./+][A-Za-z0-9_./+-]{0,254}$")
# An absolute path inside the container: no commas or '=' (they would be --mount options), no
# spaces, no '..' (checked apart), never '/' itself.
_MOUNT_TARGET = re.compile(r"^(?:/[A-Za-z0-9_.+-]+){1,32}$")
# Where a volume would hide what the container needs to run, or the kernel's views.
_RESERVED_TARGETS = ("/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/usr")


class InvalidContainerSpec(ValueError):
    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


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


class NetworkNotIsolated(ValueError):
    """The machine has a network of the tenants' name that lets containers reach each other."""


def _no_control(value: str, name: str, *, newlines: bool = False) -> None:
    bad = "\0" if newlines else "\0\n\r"
    if any(c in value for c in bad):
        raise InvalidContainerSpec(name, "must not contain NUL or line breaks")


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidContainerSpec(name, f"must be text, not {type(value).__name__}")
    return value


def _whole_number(value: object, name: str, low: int, high: int, unit: str = "") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidContainerSpec(name, f"must be a whole number from {low} to {high}{unit}")
    return value


def validate_image(image: str) -> None:
    _text(image, "image")
    if not image or len(image) > 255:
        raise InvalidContainerSpec("image", "give an image name of at most 255 characters")
    if not _IMAGE.fullmatch(image):
        raise InvalidContainerSpec(
            "image", f"'{image[:60]}' is not a Docker image name like 'pytorch/pytorch:2.3.0'"
        )


# Registries on these ranges are on the provider's own network: a pull from there makes the
# provider's Docker speak to its loopback services, its LAN or its cloud's metadata service.
_SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT, Tailscale


def _registry_loopback_allowed() -> bool:
    """As for machine addresses (HOST_ALLOW_LOOPBACK: tests, ``make run``, whose registries
    are on loopback), unless REGISTRY_ALLOW_LOOPBACK says otherwise."""
    allowed = getattr(settings, "REGISTRY_ALLOW_LOOPBACK", None)
    return loopback_allowed() if allowed is None else bool(allowed)


def _registry_address_refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return None if _registry_loopback_allowed() else "a loopback address (the machine itself)"
    if ip.is_unspecified:
        return "an unspecified address (0.0.0.0 or ::, the machine itself)"
    if ip.is_link_local:
        return "a link-local address (169.254.0.0/16, fe80::/10: cloud metadata services)"
    if ip.is_private or ip in _SHARED_ADDRESS_SPACE:
        return "a private address (the provider's own network)"
    if ip.is_multicast or ip.is_reserved:
        return "a multicast or reserved address"
    return None


def registry_refusal(image: str, *, allow_private: bool, resolve=socket.getaddrinfo) -> str | None:
    """Why the platform will not pull ``image`` on a machine (None: it may).

    Refused: a registry on loopback, link-local, private or unspecified addresses, given as an
    address or as a name resolving to one (any of its addresses), unless the machine's
    provider allows private registries (``allow_private``). Loopback is allowed where
    ``HOST_ALLOW_LOOPBACK`` is set (tests, ``make run``), as for machine addresses, unless
    ``REGISTRY_ALLOW_LOOPBACK`` is set apart. Docker
    Hub is public and not looked up. Checked at rent time and again right before a pull, since
    a name can be pointed elsewhere meanwhile; the host's Docker resolves the name once more
    itself, so this narrows the window and a provider's egress firewall closes it.
    """
    registry = registry_of(image)
    if allow_private or registry == "docker.io":
        return None
    name = registry.rsplit(":", 1)[0] if ":" in registry else registry
    lowered = name.lower().rstrip(".")
    if lowered == "localhost" or lowered.endswith(".localhost"):
        reason = _registry_address_refusal(ipaddress.ip_address("127.0.0.1"))
        return f"the registry {registry} is {reason}" if reason else None
    ip = literal_ip(name)
    if ip is not None:
        reason = _registry_address_refusal(ip)
        return f"the registry {registry} is {reason}" if reason else None
    try:
        infos = resolve(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return f"the registry name {name} does not resolve"
    for *_, sockaddr in infos:
        reason = _registry_address_refusal(ipaddress.ip_address(sockaddr[0].split("%", 1)[0]))
        if reason is not None:
            return f"the registry {registry} resolves to {sockaddr[0]}, {reason}"
    return None


def check_registry(image: str, *, allow_private: bool) -> None:
    """Raise InvalidContainerSpec("image", why) for an image from the provider's own network."""
    reason = registry_refusal(image, allow_private=allow_private)
    if reason is not None:
        raise InvalidContainerSpec(
            "image", f"{reason}; this machine's provider does not allow private registries"
        )


def validate_env(env: dict[str, str]) -> None:
    if not isinstance(env, dict):
        raise InvalidContainerSpec("env", "must be a mapping of names to values")
    if len(env) > 200:
        raise InvalidContainerSpec("env", "at most 200 variables")
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
            raise InvalidContainerSpec(
                "env", f"'{key[:40]}' is not a variable name (letters, digits, _)"
            )
        if not isinstance(value, str) or len(value) > 4096:
            raise InvalidContainerSpec(
                "env", f"{key}'s value must be text of at most 4096 characters"
            )
        _no_control(value, "env", newlines=True)


def validate_ports(ports: list[tuple[int, int, str]]) -> None:
    if len(ports) > 32:
        raise InvalidContainerSpec("ports", "at most 32 ports")
    for entry in ports:
        if not isinstance(entry, tuple | list) or len(entry) != 3:
            raise InvalidContainerSpec(
                "ports", f"{entry!r} is not (container port, host port, protocol)"
            )
        container_port, host_port, protocol = entry
        for value in (container_port, host_port):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
                raise InvalidContainerSpec("ports", f"{value!r} is not a port number (1-65535)")
        if protocol not in ("tcp", "udp"):
            raise InvalidContainerSpec("ports", f"protocol must be tcp or udp, not {protocol!r}")


def validate_volumes(volumes: list[tuple[str, str]]) -> None:
    """Named volumes only, each at its own absolute path: a host path can never be the source
    (there is no bind mount to make), and the target cannot smuggle in mount options."""
    if not isinstance(volumes, list | tuple):
        raise InvalidContainerSpec("volumes", "must be a list of (volume name, mount path)")
    if len(volumes) > 8:
        raise InvalidContainerSpec("volumes", "at most 8 volumes")
    targets = set()
    for entry in volumes:
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            raise InvalidContainerSpec("volumes", f"{entry!r} is not (volume name, mount path)")
        name, target = entry
        if not isinstance(name, str) or not _CONTAINER_REF.fullmatch(name):
            raise InvalidContainerSpec(
                "volumes", f"'{str(name)[:40]}' is not a volume name (letters, digits, _ . -)"
            )
        if (
            not isinstance(target, str)
            or len(target) > 255
            or not _MOUNT_TARGET.fullmatch(target)
            or ".." in target.split("/")
            or "." in target.split("/")
        ):
            raise InvalidContainerSpec(
                "volumes", f"'{str(target)[:60]}' is not an absolute path like /workspace"
            )
        if any(target == top or target.startswith(top + "/") for top in _RESERVED_TARGETS):
            raise InvalidContainerSpec("volumes", f"{target} is reserved for the system")
        if target in targets:
            raise InvalidContainerSpec("volumes", f"two volumes at {target}")
        targets.add(target)


def image_repository(image: str) -> str:
    """The repository an image reference names, without tag or digest, with Docker Hub's
    defaults spelled out: ``pytorch/pytorch:2.3`` → ``docker.io/pytorch/pytorch``."""
    name = image.split("@", 1)[0]
    if name.rfind(":") > name.rfind("/"):
        name = name[: name.rfind(":")]
    if name.startswith("index.docker.io/"):  # Docker's other name for Docker Hub
        name = name.removeprefix("index.")
    if registry_of(name) == "docker.io" and not name.startswith("docker.io/"):
        name = "docker.io/" + (name if "/" in name else f"library/{name}")
    return name


def image_reference(image: str) -> str:
    """The image as ``docker run`` is given it: with a tag (``:latest`` when it names none).
    Docker looks a bare name up as an image ID prefix too when no such name is cached, so a
    name of a few hex digits could otherwise start any image on the machine."""
    if "@" in image or image.rfind(":") > image.rfind("/"):
        return image
    return f"{image}:latest"


def registry_of(image: str) -> str:
    """The registry host of an image reference (Docker Hub when the first part is no host)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str
    cpus: float
    memory_mb: int
    shm_mb: int
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    ports: list[tuple[int, int, str]] = field(default_factory=list)
    gpu_uuids: list[str] = field(default_factory=list)
    entrypoint: str | None = None
    args: list[str] = field(default_factory=list)
    volumes: list[tuple[str, str]] = field(default_factory=list)  # (volume name, mount path)

    disk_gb: int | None = None  # the units' disk share, recorded as a label
    network: str = TENANT_NETWORK  # one of the platform's gpumkt-* bridges, never the host's
    log_max_kb: int = LOG_MAX_KB  # per log file; Docker keeps log_max_files of them
    log_max_files: int = LOG_MAX_FILES

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(_text(self.name, "name")):
            raise InvalidContainerSpec("name", "letters, digits, '_', '.', '-' only")
        if not _NETWORK.fullmatch(_text(self.network, "network")):
            raise InvalidContainerSpec(
                "network", "only the platform's own networks (gpumkt-…), never the host's"
            )
        _whole_number(self.log_max_kb, "log_max_kb", 16, 1024 * 1024, " KiB")
        _whole_number(self.log_max_files, "log_max_files", 1, 20)
        validate_image(self.image)
        validate_env(self.env)
        if not isinstance(self.ports, list | tuple):
            raise InvalidContainerSpec("ports", "must be a list of (container, host, protocol)")
        validate_ports(list(self.ports))
        validate_volumes(self.volumes)
        if (
            not isinstance(self.cpus, int | float)
            or isinstance(self.cpus, bool)
            or not (0 < self.cpus <= 1024)
        ):
            raise InvalidContainerSpec("cpus", "must be a number between 0 and 1024")
        _whole_number(self.memory_mb, "memory_mb", 6, 64 * 1024 * 1024, " MB")
        _whole_number(self.shm_mb, "shm_mb", 1, self.memory_mb, " MB (the memory limit)")
        if self.disk_gb is not None:
            _whole_number(self.disk_gb, "disk_gb", 1, 1_000_000, " GB")
        if not isinstance(self.labels, dict):
            raise InvalidContainerSpec("labels", "must be a mapping of keys to values")
        for key, value in self.labels.items():
            if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
                raise InvalidContainerSpec("labels", f"'{str(key)[:40]}' is not a label key")
            if len(_text(value, "labels")) > 1024:
                raise InvalidContainerSpec("labels", f"{key}'s value is over 1024 characters")
            _no_control(value, "labels")
        if not isinstance(self.gpu_uuids, list | tuple):
            raise InvalidContainerSpec("gpu_uuids", "must be a list of GPU UUIDs")
        for uuid in self.gpu_uuids:
            if not isinstance(uuid, str) or not _GPU_UUID.fullmatch(uuid):
                raise InvalidContainerSpec("gpu_uuids", f"'{str(uuid)[:40]}' is not a GPU UUID")
        if self.entrypoint is not None and not PROGRAM_NAME.fullmatch(
            _text(self.entrypoint, "entrypoint")
        ):
            raise InvalidContainerSpec(
                "entrypoint", "a program name or path (letters, digits, / . _ + -), not an option"
            )
        if not isinstance(self.args, list | tuple):
            raise InvalidContainerSpec("args", "must be a list of arguments")
        if len(self.args) > 64:
            raise InvalidContainerSpec("args", "at most 64 arguments")
        for arg in self.args:
            if not isinstance(arg, str) or len(arg) > 4096:
                raise InvalidContainerSpec(
                    "args", "each argument is text of at most 4096 characters"
                )
            _no_control(arg, "args", newlines=True)


# Docker's default weight is 1024 (one CPU's worth); the kernel takes 2..262144.
CPU_SHARES_PER_CPU = 1024


def cpu_shares(cpus: float) -> int:
    """The container's CPU weight when the machine's CPUs are contended: 1024 per core of its
    limit. A unit's cores are the same on one machine, so the weight is proportional to the
    units rented (8 GPUs, 128 cores: 1 unit = 16 cores = 16384, 3 units = 49152), and weights
    only ever compete with containers on the same machine."""
    return max(2, min(round(cpus * CPU_SHARES_PER_CPU), 262144))


def docker_run_argv(spec: ContainerSpec, *, machine_id: int, nvidia_runtime: bool) -> list[str]:
    """The exact ``docker run`` argv for a spec. Pure; every value is one argv element."""
    argv = ["docker", "run", "--detach", "--name", spec.name, "--restart", "no"]
    labels = {**spec.labels, PLATFORM_LABEL: "1", MACHINE_LABEL: str(machine_id)}
    if spec.disk_gb is not None:
        labels[DISK_LABEL] = str(spec.disk_gb)
    for key in sorted(labels):
        argv += ["--label", f"{key}={labels[key]}"]
    argv += [
        "--cpus", f"{spec.cpus:g}",
        "--cpu-shares", str(cpu_shares(spec.cpus)),
        "--memory", f"{spec.memory_mb}m",
        "--memory-reservation", f"{max(spec.memory_mb * 4 // 5, 6)}m",
        "--shm-size", f"{spec.shm_mb}m",
        "--security-opt", "no-new-privileges",
        "--pids-limit", "4096",
        "--network", spec.network,
        "--log-driver", "json-file",
        "--log-opt", f"max-size={spec.log_max_kb}k",
        "--log-opt", f"max-file={spec.log_max_files}",
    ]  # fmt: skip
    env = {k: v for k, v in spec.env.items() if not k.upper().startswith("NVIDIA_")}
    if spec.gpu_uuids:
        devices = ",".join(spec.gpu_uuids)
        if nvidia_runtime:
            # The CLI reads --gpus as CSV; the quotes keep several devices in one field.
            argv += ["--gpus", f'"device={devices}"']
        else:
            env["NVIDIA_VISIBLE_DEVICES"] = devices
    for key in sorted(env):
        argv += ["--env", f"{key}={env[key]}"]
    for container_port, host_port, protocol in spec.ports:
        argv += ["--publish", f"{host_port}:{container_port}/{protocol}"]
    for name, target in spec.volumes:
        argv += ["--mount", f"type=volume,source={name},target={target}"]
    if spec.entrypoint is not None:
        argv += ["--entrypoint", spec.entrypoint]
    # The CLI stops reading options at the image, so args can never become docker flags.
    argv.append(image_reference(spec.image))
    argv += spec.args
    return argv


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


def _container_ref(ref: str) -> str:
    if not _CONTAINER_REF.fullmatch(ref or ""):
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
        self.network_ensure(spec.network)
        try:
            return self._run(argv).stdout.strip()
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

    def network_ensure(self, name: str) -> None:
        """Make the platform network ``name`` unless the machine has it; idempotent, and safe
        for launches racing on one host (they take turns under a lock file on the host).

        The tenants' network is made with inter-container communication off and refused
        (NetworkNotIsolated) if one of its name exists that lets containers talk.
        """
        if not _NETWORK.fullmatch(name or ""):
            raise InvalidContainerSpec("network", f"'{str(name)[:40]}' is not a platform network")
        found = self._network_options(name)
        if found is None:
            create = ["docker", "network", "create", "--driver", "bridge",
                      "--label", f"{PLATFORM_LABEL}=1"]  # fmt: skip
            if name == TENANT_NETWORK:
                create += ["--opt", f"{ICC_OPTION}=false"]
            self._run(["sh", "-c", _NETWORK_CREATE, "sh", name, *create, name])
            found = self._network_options(name)
            if found is None:
                raise CommandFailed(["docker", "network"], 1, f"network {name} was not made")
        driver, options = found
        if name == TENANT_NETWORK and (driver != "bridge" or options.get(ICC_OPTION) != "false"):
            raise NetworkNotIsolated(
                f"the machine's network {name} lets containers reach each other; the provider "
                f"must remove it (docker network rm {name}) for the platform to make it again"
            )

    def _network_options(self, name: str) -> tuple[str, dict[str, str]] | None:
        """(driver, options) of the network ``name``, or None when the machine has none."""
        result = self._run(
            ["docker", "network", "inspect", "--format", "{{json .}}", name], check=False
        )
        if result.exit_code != 0:
            return None
        network = json.loads(result.stdout.splitlines()[0])
        return network.get("Driver", ""), network.get("Options") or {}

    def network_remove(self, name: str) -> bool:
        """Remove a group's network once no container uses it; True when it is gone. The
        tenants' network is shared by every rental on the machine and stays."""
        if name == TENANT_NETWORK or not _NETWORK.fullmatch(name or ""):
            raise InvalidContainerSpec("network", f"'{str(name)[:40]}' is not a group network")
        self._run(["docker", "network", "rm", name], check=False)
        return self._network_options(name) is None

    def stop(self, container: str, *, grace_seconds: int = 10) -> None:
        self._run(
            ["docker", "stop", "--time", str(grace_seconds), _container_ref(container)],
            timeout=grace_seconds + 60,
        )

    def start(self, container: str) -> None:
        self._run(["docker", "start", _container_ref(container)])

    def remove(self, container: str) -> None:
        self._run(["docker", "rm", "--force", "--volumes", _container_ref(container)])

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

    def list_platform_containers(self) -> list[ContainerState]:
        """All of the platform's containers on this machine, in one command."""
        fmt = '{{.ID}}\t{{.Names}}\t{{.State}}\t{{.Status}}\t{{.Label "gpumkt.instance"}}'
        result = self._run([
            "docker", "ps", "--all", "--no-trunc",
            "--filter", f"label={PLATFORM_LABEL}=1",
            "--filter", f"label={MACHINE_LABEL}={self.machine.pk}",
            "--format", fmt,
        ])  # fmt: skip
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
            user, password = credentials
            if not user or any(c in user for c in "\0\n\r"):
                raise InvalidContainerSpec("registry_username", "a user name on one line")
            script = (
                "dir=$(mktemp -d) && trap 'rm -rf \"$dir\"' EXIT && "
                'docker --config "$dir" login --username "$1" --password-stdin "$2" >/dev/null '
                '&& docker --config "$dir" pull "$3"'
            )
            argv = ["sh", "-c", script, "sh", user, registry_of(image), image]
            stdin = password.encode()
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

    def volume_create(self, name: str) -> None:
        self._run(
            ["docker", "volume", "create", "--label", f"{PLATFORM_LABEL}=1", _container_ref(name)]
        )

    def volume_remove(self, name: str) -> None:
        self._run(["docker", "volume", "rm", "--force", _container_ref(name)])
