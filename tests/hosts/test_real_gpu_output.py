"""What a real NVIDIA host answers, read by the platform: the files in ``real_gpu/h100/`` were
written on one NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0) by the probe's own
nvidia-smi queries, the benchmark image's program (``hosts/benchmark/image/gpu_bench.py``, run
twice); ``mps.txt`` is what ``scripts/gpu_slice_check.py`` printed there (docs/fractional-gpus.md).
These machines have no GPU, so the tests read the real output instead."""

from __future__ import annotations

from pathlib import Path

from hosts.benchmark import BenchmarkResult, parse_gpu_bench
from hosts.probe import parse_cuda_version, parse_gpu_csv, parse_gpu_utilization
from hosts.verification.rules import verdict

H100 = Path(__file__).parent / "real_gpu" / "h100"
UUID = "GPU-55187bb0-c142-15f8-3bc0-c7ad8e30d0b3"


def real(name: str) -> str:
    return (H100 / name).read_text()


def test_the_probe_reads_a_real_h100():
    (gpu,) = parse_gpu_csv(real("query.txt"))
    assert (gpu.index, gpu.uuid, gpu.name) == (0, UUID, "NVIDIA H100 80GB HBM3")
    assert (gpu.memory_mib, gpu.driver_version) == (81559, "580.159.04")
    assert parse_cuda_version(real("nvidia-smi.txt")) == "13.0"
    assert parse_gpu_utilization(real("util.txt")) == {UUID: (0, 0)}


def test_the_benchmark_images_figures_of_a_real_h100_verify_it():
    (figures,) = parse_gpu_bench(real("gpu-bench.txt"), {UUID: "NVIDIA H100 80GB HBM3"})
    assert not figures.simulated
    assert figures.compute_cap == 900
    assert 40 < figures.fp32_tflops < 67 and 600 < figures.fp16_tflops < 989
    assert 2500 < figures.mem_bw < 3350
    passed = [{"name": "gpu", "ok": True, "detail": ""}]
    bench = BenchmarkResult(steps=passed, gpus=[figures])
    healthy = verdict(self_test_failures=[], bench=bench, reliability=1.0,
                      min_reliability=0.9, min_share_of_typical=0.7)  # fmt: skip
    assert healthy.verified, healthy.reason
    # The same card judged against a demand it does not meet says which figure fell short.
    strict = verdict(self_test_failures=[], bench=bench, reliability=1.0,
                     min_reliability=0.9, min_share_of_typical=0.95)  # fmt: skip
    assert not strict.verified
    assert "FP32 TFLOPS" in strict.reason
