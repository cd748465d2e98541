"""Benchmarks of a machine, measured on it over SSH: network to and from the platform, Docker
start time, disk inside a rental-sized container, and GPU compute and memory bandwidth from
the benchmark image (``gpu`` states its contract). ``score`` defines the dlperf-style score,
``typical`` the GPU models' typical figures. Verification (``hosts.verification``) records
the results and decides."""

from hosts.benchmark.gpu import GpuBenchFailed, GpuFigures, gpu_bench_image, parse_gpu_bench
from hosts.benchmark.runner import BenchmarkResult, run_benchmark
from hosts.benchmark.score import dlperf_per_gpu
from hosts.benchmark.typical import TYPICAL, TypicalFigures, typical_for

__all__ = [
    "TYPICAL",
    "BenchmarkResult",
    "GpuBenchFailed",
    "GpuFigures",
    "TypicalFigures",
    "dlperf_per_gpu",
    "gpu_bench_image",
    "parse_gpu_bench",
    "run_benchmark",
    "typical_for",
]
