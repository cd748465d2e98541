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
    gpus: list[ProbedGpu]
    cuda_version: str
    cpu_cores: int
    ram_mb: int
    disk_free_gb: int
    docker_version: str
    nvidia_runtime: bool
    os_name: str
    problems: list[str] = field(default_factory=list)


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


def probe(machine: Machine) -> ProbeResult:
    """Ask the machine about itself: a handful of commands on the pooled connection."""
    problems = []
    gpus_out = ssh.run(machine, NVIDIA_SMI_QUERY, check=False)
    if gpus_out.exit_code != 0:
        problems.append(f"nvidia-smi failed: {gpus_out.stderr.strip()[:200]}")
        gpus = []
    else:
        gpus = parse_gpu_csv(gpus_out.stdout)
    summary = ssh.run(machine, ["nvidia-smi"], check=False).stdout
    cores = ssh.run(machine, ["nproc"]).stdout.strip()
    meminfo = ssh.run(machine, ["cat", "/proc/meminfo"]).stdout
    info_raw = ssh.run(machine, ["docker", "info", "--format", "{{json .}}"], check=False)
    docker_info = json.loads(info_raw.stdout) if info_raw.exit_code == 0 else {}
    if not docker_info:
        problems.append(
            "docker info failed: is Docker installed and is the user in the docker group?"
        )
    root = docker_info.get("DockerRootDir") or "/var/lib/docker"
    free = ssh.run(machine, ["df", "-P", "-k", root], check=False)
    os_release = ssh.run(machine, ["cat", "/etc/os-release"], check=False).stdout
    return ProbeResult(
        gpus=gpus,
        cuda_version=parse_cuda_version(summary),
        cpu_cores=int(cores) if cores.isdigit() else 0,
        ram_mb=parse_meminfo_mb(meminfo),
        disk_free_gb=parse_df_free_gb(free.stdout) if free.exit_code == 0 else 0,
        docker_version=str(docker_info.get("ServerVersion", ""))[:40],
        nvidia_runtime="nvidia" in (docker_info.get("Runtimes") or {}),
        os_name=parse_os_release(os_release)[:120],
        problems=problems,
    )


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
