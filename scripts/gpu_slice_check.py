"""Check on a GPU host that CUDA MPS enforces a slice's limits as the platform sets them.

Starts the platform's MPS control daemon (the same idempotent line the platform runs,
``hosts.runtime.mps``), then runs one client per share with the environment a slice's
container gets (``GpuSliceSpec.environment``) and reports, for each: the FP16 matrix-multiply
throughput it reaches, and whether an allocation just under its memory limit succeeds and one
over it is refused. Needs the NVIDIA driver, ``nvidia-cuda-mps-control`` and PyTorch; no
Django. Exits 1 when a limit does not hold.

    python3 scripts/gpu_slice_check.py [--percents 100 50 25] [--memory-mb 8192] [--keep-daemon]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

MPS_MODULE = Path(__file__).resolve().parents[1] / "hosts" / "runtime" / "mps.py"

# What one client measures: its FP16 tensor throughput, then allocations under and over its cap.
CLIENT = r"""
import json, os, sys, torch
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
limit_mb = int(sys.argv[1])
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.float16)
b = torch.randn(n, n, device="cuda", dtype=torch.float16)
out = torch.empty_like(a)
for _ in range(3):
    torch.mm(a, b, out=out)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    torch.mm(a, b, out=out)
end.record(); end.synchronize()
tflops = 2 * n**3 * 20 / (start.elapsed_time(end) / 1000) / 1e12
del a, b, out
torch.cuda.empty_cache()

def allocates(mb):
    try:
        block = torch.empty(mb * 2**20, dtype=torch.uint8, device="cuda")
        del block
        torch.cuda.empty_cache()
        return True
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return False

print(json.dumps({"fp16_tflops": round(tflops, 1),
                  "under_limit_ok": allocates(max(limit_mb - 1024, 256)),
                  "over_limit_refused": not allocates(limit_mb + 1024)}))
"""


def load_mps():
    spec = importlib.util.spec_from_file_location("gpumkt_mps", MPS_MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def run_client(mps, percent: int, memory_mb: int) -> dict:
    environment = mps.GpuSliceSpec(core_percent=percent, memory_mb=memory_mb).environment()
    # Outside a container the daemon's pipes are where the platform put them, not the mount.
    environment["CUDA_MPS_PIPE_DIRECTORY"] = mps.MPS_PIPE_DIRECTORY
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, str(memory_mb)],
        env={**os.environ, **environment}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--percents", type=int, nargs="+", default=[100, 50, 25])
    parser.add_argument("--memory-mb", type=int, default=8192)
    parser.add_argument("--keep-daemon", action="store_true")
    args = parser.parse_args()
    mps = load_mps()
    subprocess.run(mps.mps_daemon_start_argv(), check=True, timeout=60)
    try:
        results = {p: run_client(mps, p, args.memory_mb) for p in args.percents}
    finally:
        if not args.keep_daemon:
            subprocess.run(mps.mps_daemon_stop_argv(), check=False, timeout=60)
    full = results.get(max(args.percents), {}).get("fp16_tflops")
    held = True
    print(f"slice memory limit {args.memory_mb} MB")
    print("share  FP16 TFLOPS  of the largest share  under limit  over limit refused")
    for percent, row in results.items():
        if "error" in row:
            print(f"{percent:4d}%  failed: {row['error']}")
            held = False
            continue
        ratio = row["fp16_tflops"] / full if full else float("nan")
        print(f"{percent:4d}%  {row['fp16_tflops']:11.1f}  {ratio:20.2f}  "
              f"{str(row['under_limit_ok']):>11}  {str(row['over_limit_refused']):>18}")  # fmt: skip
        held = held and row["under_limit_ok"] and row["over_limit_refused"]
        # A share may reach a little more than its SMs (clocks, memory-bound tails), not more.
        if full and ratio > percent / max(args.percents) + 0.15:
            held = False
    print("limits hold" if held else "LIMITS DO NOT HOLD")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
