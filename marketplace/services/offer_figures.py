"""An offer's measured figures: the machine's last passing benchmark (``hosts.benchmark``),
kept per GPU on the machine, scaled to the offer's GPUs and priced by the offer's dollars per
hour. A separate step of ``offers_refresh`` so any way of cutting a machine into offers (all
its free GPUs, or bundles of 1, 2, 4…) gets the same figures for its ``num_gpus``."""

from __future__ import annotations

from billing.money import MICRO_PER_DOLLAR
from hosts.models import Machine

BENCHMARK_FIELDS = (
    "total_flops", "compute_cap", "gpu_mem_bw", "dlperf", "dlperf_per_dphtotal", "inet_up",
    "inet_down", "disk_bw", "bench_simulated",
)  # fmt: skip


def benchmark_values(machine: Machine, *, num_gpus: int, dph_total: int) -> dict:
    """The offer's benchmark columns for ``num_gpus`` of the machine's GPUs at ``dph_total``
    micro-dollars per hour. A machine never benchmarked has zeros (sorted last)."""
    dlperf = round(machine.dlperf_per_gpu * num_gpus, 2)
    dollars = dph_total / MICRO_PER_DOLLAR
    return {
        "total_flops": round(machine.tflops_per_gpu * num_gpus, 2),
        "compute_cap": machine.compute_cap,
        "gpu_mem_bw": machine.gpu_mem_bw,
        "dlperf": dlperf,
        # A free offer (price 0) is priced as a cent an hour, as the value score does.
        "dlperf_per_dphtotal": round(dlperf / max(dollars, 0.01), 2),
        "inet_up": machine.inet_up,
        "inet_down": machine.inet_down,
        "disk_bw": machine.disk_read_mbps,
        "bench_simulated": machine.bench_gpu_simulated,
    }
