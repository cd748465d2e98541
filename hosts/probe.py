"""Probing a machine over SSH: GPUs, CUDA, CPU, RAM, Docker's free disk, runtimes, OS.

The parsers are pure functions over the real tools' output, so they are tested on the exact
text the tools print.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hosts import ssh
from hosts.runtime import GPU_UUID

if TYPE_CHECKING:
    from hosts.models import Machine

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
]


class ProbeError(ValueError):
    """A tool answered with something we cannot read."""


@dataclass(frozen=True)
class ProbedGpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    driver_version: str


@dataclass(frozen=True)
class ProbeResult:
    """What a probe read. None means "could not read" (the reason is in ``problems``), so the
    machine keeps its last good figure rather than a made-up zero; ``gpus`` None means
    nvidia-smi did not answer, which says nothing about which GPUs are there."""

    gpus: list[ProbedGpu] | None
    cuda_version: str | None
    cpu_cores: int | None
    ram_mb: int | None
    disk_free_gb: int | None
    docker_version: str | None
    nvidia_runtime: bool | None
    os_name: str | None
    mps_available: bool | None = None  # the CUDA MPS control daemon is installed
    problems: list[str] = field(default_factory=list)
    disk_enforced: bool | None = None
    # Whether the tenant firewall is in place (hosts.runtime.firewall), set up with the probe.
    tenant_firewall: bool | None = None
    tenant_firewall_detail: str | None = None


def parse_gpu_csv(text: str) -> list[ProbedGpu]:
    """Rows of ``index, uuid, name, memory.total, driver_version`` (noheader, nounits)."""
    gpus = []
    for number, line in enumerate(text.strip().splitlines(), start=1):
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 5:
            raise ProbeError(
                f"nvidia-smi line {number} has {len(parts)} fields, expected 5: {line[:80]!r}"
            )
        index, uuid, name, memory, driver = parts
        if not index.isdigit() or not memory.isdigit():
            raise ProbeError(f"nvidia-smi line {number} is not index/memory numbers: {line[:80]!r}")
        if not GPU_UUID.fullmatch(uuid):
            raise ProbeError(f"nvidia-smi line {number} has no GPU UUID: {uuid[:40]!r}")
        gpus.append(ProbedGpu(int(index), uuid, name[:120], int(memory), driver[:40]))
    return gpus


def parse_cuda_version(text: str) -> str:
    match = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", text)
    return match.group(1) if match else ""


def parse_meminfo_mb(text: str) -> int:
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", text, re.MULTILINE)
    if not match:
        raise ProbeError("/proc/meminfo has no MemTotal line")
    return int(match.group(1)) // 1024


def parse_df_free_gb(text: str) -> int:
    """``df -P -k PATH``: the Available column of the last line, in GB."""
    lines = text.strip().splitlines()
    if len(lines) < 2:
        raise ProbeError("df printed no filesystem line")
    fields = lines[-1].split()
    if len(fields) < 4 or not fields[3].isdigit():
        raise ProbeError(f"df line not understood: {lines[-1][:80]!r}")
    return int(fields[3]) // (1024 * 1024)


def parse_os_release(text: str) -> str:
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.MULTILINE)
    return match.group(1) if match else ""


MPS_CHECK = "command -v nvidia-cuda-mps-control"


def has_nvidia_runtime(docker_info: dict) -> bool:
    """Whether Docker can run ``--gpus`` containers: the NVIDIA Container Toolkit registers a
    runtime named ``nvidia`` (``nvidia-ctk runtime configure``), which ``docker info`` lists."""
    runtimes = docker_info.get("Runtimes")
    return isinstance(runtimes, dict) and "nvidia" in runtimes


# Mount options that turn XFS project quotas on (``findmnt`` prints the kernel's spelling).
# (``pqnoenforce`` counts without enforcing, so it does not.)
_PROJECT_QUOTA_OPTIONS = {"prjquota", "pquota"}


def storage_quota_supported(docker_info: dict, mount_options: str | None) -> bool:
    """Whether ``docker run --storage-opt size=`` caps a container's writable layer here.

    Docker honours it on its btrfs storage driver (subvolume quotas) and on overlay2 when
    the data root is XFS mounted with project quotas (``prjquota``); on any other driver or
    filesystem ``docker run`` refuses the option. ``mount_options`` is ``findmnt -no OPTIONS``
    of the data root (None when it could not be read).
    """
    driver = str(docker_info.get("Driver", ""))
    if driver == "btrfs":
        return True
    if driver != "overlay2":
        return False
    pairs = docker_info.get("DriverStatus") or []
    status = dict(pair for pair in pairs if isinstance(pair, list | tuple) and len(pair) == 2)
    if status.get("Backing Filesystem") != "xfs" or not mount_options:
        return False
    return bool(_PROJECT_QUOTA_OPTIONS & set(mount_options.strip().split(",")))


def probe(machine: Machine) -> ProbeResult:
    """Ask the machine about itself: a handful of commands on the pooled connection.

    Each tool that fails or prints something unreadable becomes a problem and an unknown
    figure; only losing the machine itself (HostUnreachable, HostKeyMismatch) raises.
    """
    problems: list[str] = []

    def read(argv: list[str]) -> str | None:
        result = ssh.run(machine, argv, check=False, idempotent=True)
        if result.exit_code != 0:
            detail = (result.stderr or result.stdout).strip()[:200]
            tool = " ".join(argv[:2]) if len(argv) > 1 and not argv[1].startswith("-") else argv[0]
            problems.append(f"{tool} failed: {detail}")
            return None
        return result.stdout

    def parsed(parse, text: str | None):
        if text is None:
            return None
        try:
            return parse(text)
        except ProbeError as error:
            problems.append(str(error))
            return None

    gpus = parsed(parse_gpu_csv, read(NVIDIA_SMI_QUERY))
    summary = ssh.run(machine, ["nvidia-smi"], check=False, idempotent=True)
    cores_text = read(["nproc"])
    cores = int(cores_text.strip()) if cores_text and cores_text.strip().isdigit() else None
    if cores_text is not None and cores is None:
        problems.append(f"nproc printed {cores_text.strip()[:40]!r}")
    ram_mb = parsed(parse_meminfo_mb, read(["cat", "/proc/meminfo"]))
    info_raw = ssh.run(
        machine, ["docker", "info", "--format", "{{json .}}"], check=False, idempotent=True
    )
    try:
        docker_info = json.loads(info_raw.stdout) if info_raw.exit_code == 0 else {}
    except ValueError:
        docker_info = {}
    if not isinstance(docker_info, dict) or not docker_info:
        docker_info = {}
        problems.append(
            "docker info failed: is Docker installed and is the user in the docker group?"
        )
    root = docker_info.get("DockerRootDir") or "/var/lib/docker"
    disk = parsed(parse_df_free_gb, read(["df", "-P", "-k", root]))
    disk_enforced = None
    if docker_info:
        options = ssh.run(
            machine, ["findmnt", "-no", "OPTIONS", "--target", root], check=False, idempotent=True
        )
        disk_enforced = storage_quota_supported(
            docker_info, options.stdout if options.exit_code == 0 else None
        )
    os_release = ssh.run(machine, ["cat", "/etc/os-release"], check=False, idempotent=True)
    # GPU sharing needs CUDA MPS next to a working driver; a constant line, no input in it.
    mps = ssh.run(machine, ["sh", "-c", MPS_CHECK], check=False, idempotent=True)
    return ProbeResult(
        gpus=gpus,
        cuda_version=parse_cuda_version(summary.stdout) if summary.exit_code == 0 else None,
        cpu_cores=cores,
        ram_mb=ram_mb,
        disk_free_gb=disk,
        docker_version=str(docker_info.get("ServerVersion", ""))[:40] if docker_info else None,
        nvidia_runtime=has_nvidia_runtime(docker_info) if docker_info else None,
        os_name=parse_os_release(os_release.stdout)[:120] if os_release.exit_code == 0 else None,
        mps_available=mps.exit_code == 0 and gpus is not None,
        problems=problems,
        disk_enforced=disk_enforced,
    )


# --- What the GPUs are doing now (the machine's usage page) ------------------------------------

GPU_UTILIZATION_QUERY = [
    "nvidia-smi",
    "--query-gpu=uuid,utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
]


def parse_gpu_utilization(text: str) -> dict[str, tuple[int | None, int | None]]:
    """``uuid, utilization.gpu, memory.used`` rows → {uuid: (percent, MiB used)}; a value
    nvidia-smi cannot read ("[N/A]") is None."""

    def number(value: str) -> int | None:
        return int(value) if value.isdigit() else None

    found = {}
    for line in text.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and GPU_UUID.fullmatch(parts[0]):
            found[parts[0]] = (number(parts[1]), number(parts[2]))
    return found


def gpu_utilization(machine: Machine) -> dict[str, tuple[int | None, int | None]]:
    """Each GPU's utilization now, read over SSH (empty when nvidia-smi fails)."""
    result = ssh.run(machine, GPU_UTILIZATION_QUERY, check=False, idempotent=True, timeout=15)
    return parse_gpu_utilization(result.stdout) if result.exit_code == 0 else {}


# --- Reading a container's limits back (the self-test) ----------------------------------------

CGROUP_V2_FILES = ["/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/memory.max"]
CGROUP_V1_FILES = [
    "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
    "/sys/fs/cgroup/cpu/cpu.cfs_period_us",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
]
# cgroup v1 reports "no limit" as a huge page-aligned number rather than "max".
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupLimits:
    cpus: float | None  # None: no CPU limit
    memory_bytes: int | None  # None: no memory limit


def parse_cgroup_v2(text: str) -> CgroupLimits:
    """``cat cpu.max memory.max``: "<quota|max> <period>" then "<bytes|max>"."""
    lines = text.split()
    if len(lines) != 3:
        raise ProbeError(f"cgroup v2 files not understood: {text[:80]!r}")
    quota, period, memory = lines
    if not period.isdigit() or not (quota == "max" or quota.isdigit()):
        raise ProbeError(f"cpu.max not understood: {quota} {period}")
    if not (memory == "max" or memory.isdigit()):
        raise ProbeError(f"memory.max not understood: {memory!r}")
    return CgroupLimits(
        cpus=None if quota == "max" else int(quota) / int(period),
        memory_bytes=None if memory == "max" else int(memory),
    )


def parse_cgroup_v1(text: str) -> CgroupLimits:
    """``cat cpu.cfs_quota_us cpu.cfs_period_us memory.limit_in_bytes``."""
    values = text.split()
    if len(values) != 3 or not all(v.lstrip("-").isdigit() for v in values):
        raise ProbeError(f"cgroup v1 files not understood: {text[:80]!r}")
    quota, period, memory = (int(v) for v in values)
    return CgroupLimits(
        cpus=None if quota < 0 or period <= 0 else quota / period,
        memory_bytes=None if memory >= _V1_UNLIMITED else memory,
    )


def parse_df_size_kb(text: str) -> int:
    """``df -k PATH`` (busybox or GNU): the size column (1K-blocks) of the last line."""
    lines = text.strip().splitlines()
    fields = lines[-1].split() if len(lines) >= 2 else []
    if len(fields) < 2 or not fields[1].isdigit():
        raise ProbeError(f"df line not understood: {text[-80:]!r}")
    return int(fields[1])
