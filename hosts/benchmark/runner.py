"""A benchmark of one machine over SSH: what a rental there would get.

- network: a fixed payload sent to the host and one read back over the machine's SSH channel
  (the path between the platform and the host), timed, minus one no-op round trip;
- Docker start: how long ``docker run`` takes to start a container with a rental's limits
  (one unit's CPUs, memory, shm and, where the host caps it, disk);
- disk: writing and reading a file inside that container, with ``dd`` (direct I/O where the
  storage driver allows it; otherwise the write is synced and the read says it came from the
  page cache);
- GPU: the benchmark image on the free GPUs (``hosts.benchmark.gpu``).

Each step is a dict ``{"name", "ok", "detail"}`` like the self-test's; figures that could not
be measured are None. Nothing here writes to the database.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from dataclasses import dataclass, field

from django.conf import settings

from hosts import ssh
from hosts.benchmark.gpu import GpuBenchFailed, GpuFigures, run_gpu_bench
from hosts.benchmark.score import dlperf_per_gpu
from hosts.models import Machine
from hosts.runtime import ContainerSpec, DockerHost, InvalidContainerSpec
from hosts.selectors import rented_gpu_ids

BENCH_FILE = "/root/gpumkt-bench"
# dd timed inside the container by the kernel's uptime clock (10 ms steps): busybox's dd
# prints no figures and its date has no sub-second format. Prints "<start> <end>" seconds.
TIMED_DD = 'a=$(cut -d" " -f1 /proc/uptime); dd "$@" 2>/dev/null || exit 1; b=$(cut -d" " -f1 /proc/uptime); echo "$a $b"'
CLOCK_STEP = 0.01


def disk_megabytes() -> int:
    return int(getattr(settings, "HOST_BENCH_DISK_MB", 64))


def transfer_megabytes() -> int:
    return int(getattr(settings, "HOST_BENCH_TRANSFER_MB", 8))


@dataclass
class BenchmarkResult:
    steps: list[dict] = field(default_factory=list)
    gpus: list[GpuFigures] = field(default_factory=list)
    inet_up: float | None = None
    inet_down: float | None = None
    docker_start_ms: int | None = None
    disk_write_mbps: float | None = None
    disk_read_mbps: float | None = None

    @property
    def passed(self) -> bool:
        return bool(self.steps) and all(step["ok"] for step in self.steps)

    @property
    def failures(self) -> list[str]:
        return [f"{step['name']}: {step['detail']}" for step in self.steps if not step["ok"]]

    @property
    def gpu_simulated(self) -> bool:
        return any(gpu.simulated for gpu in self.gpus)

    def per_gpu(self, name: str) -> float | None:
        """The mean of a GPU figure over the measured GPUs (None without any)."""
        if not self.gpus:
            return None
        return round(sum(getattr(gpu, name) for gpu in self.gpus) / len(self.gpus), 2)

    @property
    def dlperf_per_gpu(self) -> float | None:
        if not self.gpus:
            return None
        return dlperf_per_gpu(
            fp16_tflops=self.per_gpu("fp16_tflops") or 0,
            mem_bw=self.per_gpu("mem_bw") or 0,
            disk_read_mbps=self.disk_read_mbps,
        )

    def step(self, name: str, ok: bool, detail: str) -> None:
        self.steps.append({"name": name, "ok": bool(ok), "detail": detail[:300]})


def run_benchmark(*, machine: Machine, labels: dict[str, str]) -> BenchmarkResult:
    result = BenchmarkResult()
    try:
        _network(machine, result)
    except ssh.HostError as error:
        result.step("network", False, str(error))
        return result
    host = DockerHost(machine)
    _container_steps(host, machine, result, labels)
    _gpu_step(host, machine, result, labels)
    return result


def _network(machine: Machine, result: BenchmarkResult) -> None:
    size = transfer_megabytes() * 1024 * 1024
    started = time.perf_counter()
    ssh.run(machine, ["true"], idempotent=True)
    round_trip = time.perf_counter() - started
    payload = secrets.token_bytes(size)  # incompressible, should the channel compress
    started = time.perf_counter()
    received = list(ssh.pool.stream(machine, ["wc", "-c"], stdin=payload, timeout=120))
    up_seconds = max(time.perf_counter() - started - round_trip, 1e-6)
    counted = int(received[-1].split()[0]) if received and received[-1].split() else -1
    if counted != size:
        result.step("upload", False, f"sent {size} bytes, the host counted {counted}")
        return
    started = time.perf_counter()
    read = ssh.run(machine, ["head", "-c", str(size), "/dev/urandom"], timeout=120)
    down_seconds = max(time.perf_counter() - started - round_trip, 1e-6)
    # Decoded with replacement, so the count is of characters: at least one per 4 bytes read.
    if len(read.stdout) < size // 4:
        result.step("download", False, f"asked {size} bytes, got {len(read.stdout)} characters")
        return
    # Directions as a renter sees them on the host: "down" into the host, "up" out of it.
    result.inet_down = round(size * 8 / up_seconds / 1e6, 1)
    result.inet_up = round(size * 8 / down_seconds / 1e6, 1)
    result.step(
        "network",
        True,
        f"{size // (1024 * 1024)} MB each way over SSH: {result.inet_down:g} Mbit/s to the "
        f"host, {result.inet_up:g} Mbit/s from it",
    )


def _rental_spec(machine: Machine, labels: dict[str, str]) -> ContainerSpec:
    """A container with one unit's limits (a unit is the smallest rental)."""
    memory = max(machine.unit_memory_mb, 64)
    return ContainerSpec(
        name=f"gpumkt-bench-{machine.pk}-{secrets.token_hex(4)}",
        image=settings.HOST_SELFTEST_IMAGE,
        cpus=max(machine.unit_cpus, 0.1),
        memory_mb=memory,
        shm_mb=max(min(machine.unit_shm_mb, memory), 1),
        labels={"gpumkt.benchmark": "1", **labels},
        disk_gb=max(machine.unit_disk_gb, 1) if machine.disk_enforced else None,
        disk_enforced=machine.disk_enforced,
        entrypoint="sleep",
        args=["600"],
    )


def _container_steps(
    host: DockerHost, machine: Machine, result: BenchmarkResult, labels: dict[str, str]
) -> None:
    try:
        spec = _rental_spec(machine, labels)
    except InvalidContainerSpec as error:
        result.step("docker start", False, f"bad benchmark container: {error}")
        return
    container = ""
    try:
        if not host.image_present(spec.image):
            host.pull(spec.image)
        started = time.perf_counter()
        container = host.run(spec)
        result.docker_start_ms = int((time.perf_counter() - started) * 1000)
        result.step(
            "docker start",
            True,
            f"{result.docker_start_ms} ms for a container with a unit's limits "
            f"({spec.cpus:g} CPUs, {spec.memory_mb} MB)",
        )
        _disk(host, container, result, machine)
    except ssh.HostError as error:
        result.step("docker start", False, str(error))
    finally:
        with contextlib.suppress(ssh.HostError):
            host.remove(container or spec.name)


def _disk(host: DockerHost, container: str, result: BenchmarkResult, machine: Machine) -> None:
    megabytes = disk_megabytes()
    if machine.disk_enforced:  # stay well inside the unit's capped disk
        megabytes = max(min(megabytes, machine.unit_disk_gb * 1024 // 4), 1)
    write = [f"of={BENCH_FILE}", "if=/dev/zero", "bs=1M", f"count={megabytes}"]
    wrote_direct = _dd(host, container, [*write, "oflag=direct"], megabytes)
    wrote = wrote_direct or _dd(host, container, [*write, "conv=fsync"], megabytes)
    if wrote is None:
        result.step("disk write", False, f"dd could not write {megabytes} MB in the container")
        return
    result.disk_write_mbps = wrote
    read_file = [f"if={BENCH_FILE}", "of=/dev/null", "bs=1M"]
    direct = _dd(host, container, [*read_file, "iflag=direct"], megabytes)
    read = direct or _dd(host, container, read_file, megabytes)
    if read is None:
        result.step("disk read", False, "dd could not read the file back")
        return
    result.disk_read_mbps = read
    result.step(
        "disk",
        True,
        f"{megabytes} MB in the container: write {wrote:g} MB/s"
        + ("" if wrote_direct else " (synced: no direct I/O here)")
        + f", read {read:g} MB/s"
        + ("" if direct else " (from the page cache: no direct I/O here)"),
    )


def _dd(host: DockerHost, container: str, args: list[str], megabytes: int) -> float | None:
    """MB/s of ``dd`` with ``args`` moving ``megabytes``, or None when it failed."""
    done = host.exec(container, ["sh", "-c", TIMED_DD, "sh", *args], timeout=120)
    try:
        start, end = (float(word) for word in done.stdout.split()[-2:])
    except ValueError:
        return None
    if done.exit_code != 0:
        return None
    return round(megabytes * 1.048576 / max(end - start, CLOCK_STEP), 1)


def _gpu_step(
    host: DockerHost, machine: Machine, result: BenchmarkResult, labels: dict[str, str]
) -> None:
    rented = rented_gpu_ids([machine.pk])
    free = {g.uuid: g.name for g in machine.gpus.filter(present=True) if g.pk not in rented}
    if not free:
        result.step("gpu", True, "no free GPU to measure (all rented); skipped")
        return
    try:
        result.gpus = run_gpu_bench(host, machine, free, labels)
    except (GpuBenchFailed, ssh.HostError) as error:
        result.step("gpu", False, str(error))
        return
    how = "simulated: the model's typical figures" if result.gpu_simulated else "measured"
    result.step(
        "gpu",
        True,
        f"{len(result.gpus)} GPU(s), {how}: {result.per_gpu('fp32_tflops'):g} FP32 TFLOPS, "
        f"{result.per_gpu('fp16_tflops'):g} FP16 TFLOPS, {result.per_gpu('mem_bw'):g} GB/s each",
    )
