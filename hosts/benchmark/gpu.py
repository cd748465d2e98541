"""The GPU part of a benchmark: the benchmark image run on the machine's free GPUs.

The contract with the image (``settings.HOST_GPU_BENCH_IMAGE``): it is started like a rental,
its GPUs pinned by UUID, with no arguments, and prints one JSON object per GPU, one per line,
then exits 0::

    {"uuid": "GPU-…", "compute_cap": "8.9", "fp32_tflops": 80.2, "fp16_tflops": 160.1,
     "mem_bw": 951.0, "simulated": false}

``fp32_tflops`` is a timed FP32 matrix multiply, ``fp16_tflops`` an FP16 tensor-core one (FP32
accumulate), ``mem_bw`` a timed device-to-device copy in GB/s. A stand-in GPU (the simulated
hosts') cannot be measured: its image prints ``{"uuid": "GPU-…", "simulated": true}`` and the
platform records the GPU model's typical figures (``hosts.benchmark.typical``) marked
simulated. Other lines (progress, warnings) are ignored; a GPU the image does not report, a
non-zero exit, or figures that are not positive numbers fail the run.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import dataclass

from django.conf import settings

from hosts import ssh
from hosts.benchmark.typical import typical_for
from hosts.models import Machine
from hosts.runtime import ContainerSpec, DockerHost, InvalidContainerSpec

GPU_FIGURES = ("fp32_tflops", "fp16_tflops", "mem_bw")


@dataclass(frozen=True)
class GpuFigures:
    uuid: str
    name: str
    compute_cap: int
    fp32_tflops: float
    fp16_tflops: float
    mem_bw: float
    simulated: bool


class GpuBenchFailed(Exception):
    pass


def gpu_bench_image() -> str:
    return getattr(settings, "HOST_GPU_BENCH_IMAGE", "gpumkt/gpu-bench:1")


def gpu_bench_timeout() -> float:
    return float(getattr(settings, "HOST_GPU_BENCH_TIMEOUT", 300))


def run_gpu_bench(
    host: DockerHost, machine: Machine, gpus: dict[str, str], labels: dict[str, str]
) -> list[GpuFigures]:
    """Run the image on ``gpus`` (UUID → nvidia-smi's name) and return each GPU's figures."""
    image = gpu_bench_image()
    try:
        spec = ContainerSpec(
            name=f"gpumkt-bench-gpu-{machine.pk}-{secrets.token_hex(4)}",
            image=image,
            cpus=max(min(machine.unit_cpus * len(gpus), 4.0), 0.5),
            memory_mb=2048,
            shm_mb=512,
            labels={"gpumkt.benchmark": "1", **labels},
            gpu_uuids=sorted(gpus),
        )
    except InvalidContainerSpec as error:
        raise GpuBenchFailed(f"bad benchmark container: {error}") from error
    container = ""
    try:
        if not host.image_present(image):
            try:
                host.pull(image)
            except ssh.CommandFailed as error:
                raise GpuBenchFailed(f"could not pull {image}: {error}") from error
        container = host.run(spec)
        waited = ssh.run(
            machine, ["docker", "wait", container], timeout=gpu_bench_timeout(), check=False
        )
        output = host.logs(container, tail=500)
        code = waited.stdout.strip()
        if waited.exit_code != 0 or code != "0":
            last = " | ".join(output.strip().splitlines()[-3:]) or waited.stderr.strip()
            raise GpuBenchFailed(f"{image} exited {code or '?'}: {last[:200]}")
    finally:
        with contextlib.suppress(ssh.HostError):
            host.remove(container or spec.name)
    return parse_gpu_bench(output, gpus)


def parse_gpu_bench(output: str, gpus: dict[str, str]) -> list[GpuFigures]:
    """Each asked GPU's figures from the image's output (the contract above)."""
    reported: dict[str, dict] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("uuid") in gpus:
            reported[row["uuid"]] = row
    figures = []
    for uuid, name in sorted(gpus.items()):
        row = reported.get(uuid)
        if row is None:
            raise GpuBenchFailed(f"the benchmark reported nothing for {uuid}")
        figures.append(_figures(uuid, name, row))
    return figures


def _figures(uuid: str, name: str, row: dict) -> GpuFigures:
    if row.get("simulated") is True:
        typical = typical_for(name)
        if typical is None:
            raise GpuBenchFailed(f"{name} is simulated and has no typical figures to stand in")
        return GpuFigures(uuid, name, typical.compute_cap, typical.fp32_tflops,
                          typical.fp16_tflops, typical.mem_bw, simulated=True)  # fmt: skip
    values = {}
    for key in GPU_FIGURES:
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise GpuBenchFailed(f"{uuid}: {key} is not a positive number ({value!r})")
        values[key] = float(value)
    return GpuFigures(uuid, name, _compute_cap(row.get("compute_cap")), simulated=False, **values)


def _compute_cap(value: object) -> int:
    """ "8.9" or 8.9 → 890; anything else → 0 (unknown)."""
    try:
        return round(float(str(value)) * 100)
    except ValueError:
        return 0
