"""What a container may be: the spec, checked field by field, and the ``docker run`` argv
made from it.

``ContainerSpec`` is validated field by field (``InvalidContainerSpec`` names the field), and
``docker_run_argv`` is a pure function from a spec to an argv list. It can only produce the
flags written below: no ``--privileged``, no host networking (only the platform's own
``gpumkt-*`` bridge networks), no bind mounts (only named volumes, by ``--mount
type=volume``; the one exception is a GPU slice's read-only view of the platform's own MPS pipe
directory, ``hosts.runtime.mps``), no Docker socket, no renter ``NVIDIA_*`` or ``CUDA_MPS_*``
variables. GPUs are pinned by UUID:
``--gpus`` where the NVIDIA runtime exists, else ``NVIDIA_VISIBLE_DEVICES``. Logs are capped.
Capabilities are only ``RENTAL_CAPABILITIES`` (no ``NET_RAW``: no raw sockets, no ping), and
swap is no bigger than the memory limit.
The image is always given with a tag (``image_reference``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hosts.runtime.mps import MPS_VARIABLE_PREFIX, GpuSliceSpec

PLATFORM_LABEL = "gpumkt.platform"
MACHINE_LABEL = "gpumkt.machine"
# The rental's disk, recorded on every container. Docker caps a container's writable layer
# (--storage-opt size=…) only on its btrfs driver or overlay2 over XFS with project quotas;
# where the probe found one (Machine.disk_enforced) the cap is given too, else it is a label.
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
# The platform's own networks, the only ones a container may join (made by DockerHost).
NETWORK_NAME = re.compile(r"^gpumkt-[a-z0-9][a-z0-9_.-]{0,100}$")

# json-file logs are kept in full by default: a container printing forever fills the
# provider's disk (and its co-tenants' with it). 3 files of 10 MiB keep the last 20-30 MiB,
# enough for `docker logs --tail` and a crash's story; Docker rotates and drops the oldest.
LOG_MAX_KB = 10 * 1024
LOG_MAX_FILES = 3

# The capabilities a rental keeps (``--cap-drop ALL``, then these back): what root inside an
# ordinary image uses to install packages, run sshd and serve. Files: CHOWN, DAC_OVERRIDE,
# FOWNER, FSETID (apt/dpkg, pip as root, chown of a volume); users: SETUID, SETGID (sshd's
# privilege separation, su, apt's _apt sandbox); SYS_CHROOT (sshd's privsep chroot); KILL
# (signalling one's own processes of another uid); NET_BIND_SERVICE (sshd on 22, a web
# server on 80); AUDIT_WRITE (sshd and PAM write a login record, refused logins otherwise).
# Gone, from Docker's defaults: NET_RAW (raw sockets: forged packets, ARP spoofing on the
# shared bridge), MKNOD (device nodes), SETFCAP and SETPCAP (file and process capabilities,
# useless to a rental and a way to keep privileges across exec).
RENTAL_CAPABILITIES = (
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE",
    "SETGID", "SETUID", "SYS_CHROOT",
)  # fmt: skip
# Docker opens unprivileged ICMP sockets to every group in a container (ping without NET_RAW);
# the kernel's own default, no group, closes them too: a rental does not ping.
NO_PING_SOCKETS = "net.ipv4.ping_group_range=1 0"

# Docker's reference grammar: [registry[:port]/]path[:tag][@digest], lower-case path.
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
# What Docker takes for a local image's id (or a prefix of one): `sha256:<hex>`. A bare hex
# name is safe: docker_run_argv gives it a tag, and `3f2a:latest` is a name.
_IMAGE_ID = re.compile(r"^sha256:[a-f0-9]+$")
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
# A container, volume or network reference as DockerHost passes it to docker.
CONTAINER_REF = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$")
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
    if _IMAGE_ID.fullmatch(image):
        # Docker runs a local image by its id or a prefix of it, which would pass by the
        # checks a name gets: another team's committed image, a private one whose registry
        # refuses this team.
        raise InvalidContainerSpec(
            "image",
            f"'{image[:60]}' is an image id, which Docker would run from the machine's local "
            "copies; give the image's name",
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
        if not isinstance(name, str) or not CONTAINER_REF.fullmatch(name):
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


def image_reference(image: str) -> str:
    """The image as ``docker run`` is given it: with a tag (``:latest`` when it names none).
    Docker looks a bare name up as an image ID prefix too when no such name is cached, so a
    name of a few hex digits could otherwise start any image on the machine."""
    if "@" in image or image.rfind(":") > image.rfind("/"):
        return image
    return f"{image}:latest"


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
    # A slice of its one card (fractional GPU), enforced by CUDA MPS; None for whole GPUs.
    gpu_slice: GpuSliceSpec | None = None

    disk_gb: int | None = None  # the rental's disk, recorded as a label
    disk_enforced: bool = False  # and capped (--storage-opt size=) where the host can
    network: str = TENANT_NETWORK  # one of the platform's gpumkt-* bridges, never the host's
    log_max_kb: int = LOG_MAX_KB  # per log file; Docker keeps log_max_files of them
    log_max_files: int = LOG_MAX_FILES

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(_text(self.name, "name")):
            raise InvalidContainerSpec("name", "letters, digits, '_', '.', '-' only")
        if not NETWORK_NAME.fullmatch(_text(self.network, "network")):
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
        if self.gpu_slice is not None:
            _whole_number(self.gpu_slice.core_percent, "gpu_slice.core_percent", 1, 100, " %")
            _whole_number(self.gpu_slice.memory_mb, "gpu_slice.memory_mb", 1, 16 << 20, " MB")
            if len(self.gpu_uuids) != 1:
                raise InvalidContainerSpec("gpu_slice", "a slice is pinned to exactly one card")
        for uuid in self.gpu_uuids:
            if not isinstance(uuid, str) or not GPU_UUID.fullmatch(uuid):
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
        # Swap equal to the memory limit means no swap: Docker's default (swap of the same
        # size again) would let a rental page the host's disk for its co-tenants.
        "--memory-swap", f"{spec.memory_mb}m",
        "--memory-reservation", f"{max(spec.memory_mb * 4 // 5, 6)}m",
        "--shm-size", f"{spec.shm_mb}m",
        "--security-opt", "no-new-privileges",
        "--cap-drop", "ALL",
        *(option for cap in RENTAL_CAPABILITIES for option in ("--cap-add", cap)),
        "--sysctl", NO_PING_SOCKETS,
        "--pids-limit", "4096",
        "--network", spec.network,
    ]  # fmt: skip
    if spec.disk_gb is not None and spec.disk_enforced:
        argv += ["--storage-opt", f"size={spec.disk_gb}G"]
    argv += [
        "--log-driver", "json-file",
        "--log-opt", f"max-size={spec.log_max_kb}k",
        "--log-opt", f"max-file={spec.log_max_files}",
    ]  # fmt: skip
    env = {
        k: v
        for k, v in spec.env.items()
        if not k.upper().startswith(("NVIDIA_", MPS_VARIABLE_PREFIX))
    }
    if spec.gpu_uuids:
        devices = ",".join(spec.gpu_uuids)
        if nvidia_runtime:
            # The CLI reads --gpus as CSV; the quotes keep several devices in one field.
            argv += ["--gpus", f'"device={devices}"']
        else:
            env["NVIDIA_VISIBLE_DEVICES"] = devices
    if spec.gpu_slice is not None:
        env.update(spec.gpu_slice.environment())
        argv += ["--mount", spec.gpu_slice.mount()]
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
