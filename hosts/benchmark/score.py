"""The dlperf-style score: how fast deep-learning training runs on one GPU of a machine.

    dlperf per GPU = (0.6 × FP16 tensor TFLOPS + 0.4 × memory bandwidth GB/s ÷ 10) × feed
    feed           = 0.8 + 0.2 × min(1, disk read MB/s ÷ 1000)

Why: a training step spends its time in matrix multiplies, bound by tensor-core throughput,
and in element-wise work, attention and optimizer updates, bound by memory bandwidth; for
today's models the first is roughly 60 % of the time. Dividing GB/s by 10 puts bandwidth on
the scale of TFLOPS (current cards have 6–10 GB/s of bandwidth per dense FP16 TFLOP), so
neither term swamps the other. ``feed`` takes up to a fifth off a host whose disk cannot feed
its GPUs (1 GB/s reads keep a GPU busy on typical image and token pipelines); the network
does not enter, since training reads from local disk. An offer's ``dlperf`` is this × its
GPUs, ``dlperf_per_dphtotal`` that ÷ its dollars per hour.
"""

from __future__ import annotations

COMPUTE_WEIGHT = 0.6
BANDWIDTH_WEIGHT = 0.4
BANDWIDTH_PER_TFLOP = 10.0  # GB/s that count as much as one TFLOP
FEED_FLOOR = 0.8
FEED_FULL_MBPS = 1000.0


def dlperf_per_gpu(*, fp16_tflops: float, mem_bw: float, disk_read_mbps: float | None) -> float:
    compute = COMPUTE_WEIGHT * max(fp16_tflops, 0.0)
    bandwidth = BANDWIDTH_WEIGHT * max(mem_bw, 0.0) / BANDWIDTH_PER_TFLOP
    feed = FEED_FLOOR + (1 - FEED_FLOOR) * min(
        1.0, max(disk_read_mbps or 0.0, 0.0) / FEED_FULL_MBPS
    )
    return round((compute + bandwidth) * feed, 2)
