"""The platform's GPU benchmark: the program inside ``gpumkt/gpu-bench`` (see ``Dockerfile``).

It keeps the contract in ``hosts/benchmark/gpu.py``: started with the machine's GPUs pinned
(as a rental's are) and no arguments, it prints one JSON object per visible GPU, one per line,
and exits 0; any failure prints why on stderr and exits 1, which fails the run.

Each figure is what a renter's code gets, timed with CUDA events after warm-up runs:

- ``fp32_tflops``: an FP32 matrix multiply with TF32 turned off (plain FP32 units, as the
  vendors' "FP32" figure counts them);
- ``fp16_tflops``: an FP16 matrix multiply on the tensor cores with FP32 accumulation
  (reduced-precision reductions off), the mixed-precision training case;
- ``mem_bw``: a device-to-device copy, counting the bytes read and the bytes written (as the
  vendors' bandwidth figure does).

It runs with PyTorch alone (no network, no files), so it also runs outside the image on any
host with CUDA and PyTorch: ``python3 gpu_bench.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

MATRIX_SIZE = int(os.environ.get("GPU_BENCH_MATRIX", "8192"))
COPY_MIB = int(os.environ.get("GPU_BENCH_COPY_MIB", "1024"))
WARMUP, REPEAT = 3, 10


def seconds_per_call(torch, call) -> float:
    for _ in range(WARMUP):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPEAT):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / REPEAT


def matmul_tflops(torch, device, dtype) -> float:
    n = MATRIX_SIZE
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = seconds_per_call(torch, lambda: torch.mm(a, b, out=out))
    return 2 * n**3 / seconds / 1e12


def copy_gbps(torch, device) -> float:
    source = torch.empty(COPY_MIB * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = seconds_per_call(torch, lambda: target.copy_(source))
    return 2 * source.numel() / seconds / 1e9


def nvidia_smi_uuids() -> list[str]:
    """The visible GPUs' UUIDs in CUDA's order (PCI bus order, which CUDA_DEVICE_ORDER pins)."""
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()]


def gpu_uuid(torch, index: int, listed: list[str] | None) -> str:
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
    if listed is None or index >= len(listed):
        raise RuntimeError(f"cannot tell the UUID of CUDA device {index}")
    return listed[index]


def measure(torch, index: int, uuid: str) -> dict:
    device = torch.device("cuda", index)
    props = torch.cuda.get_device_properties(index)
    with torch.cuda.device(device):
        figures = {
            "uuid": uuid,
            "name": props.name,
            "compute_cap": f"{props.major}.{props.minor}",
            "fp32_tflops": round(matmul_tflops(torch, device, torch.float32), 1),
            "fp16_tflops": round(matmul_tflops(torch, device, torch.float16), 1),
            "mem_bw": round(copy_gbps(torch, device), 1),
            "simulated": False,
        }
        torch.cuda.empty_cache()
    return figures


def main() -> int:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        import torch
    except ImportError:
        print("gpu-bench: PyTorch is not installed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("gpu-bench: no CUDA device is visible", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    try:
        listed = nvidia_smi_uuids()
    except (OSError, subprocess.SubprocessError):
        listed = None
    for index in range(torch.cuda.device_count()):
        try:
            uuid = gpu_uuid(torch, index, listed)
            print(json.dumps(measure(torch, index, uuid)), flush=True)
        except Exception as error:  # noqa: BLE001 (any CUDA failure fails the whole run)
            print(f"gpu-bench: CUDA device {index} failed: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
