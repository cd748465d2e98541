"""Placement decisions: 10,000 machines, 10,000 requests, one core.

Budget (DESIGN.md): ≥ 5,000 decisions/s. Pure functions, no database.

    .venv/bin/python bench/placement.py
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.placement import MachineSnapshot, PlacementRequest, Planner  # noqa: E402

MODELS = ["RTX 4090", "RTX 3090", "A100-SXM4-80GB", "H100-SXM5-80GB", "L40S", "RTX A6000"]
REGIONS = ["US", "CA", "EU", "AS"]


def main(machines: int = 10_000, requests: int = 10_000) -> None:
    rng = random.Random(7)
    snapshot, gpu_id = [], 0
    for machine_id in range(machines):
        count = rng.choice([1, 2, 4, 8, 8])
        snapshot.append(
            MachineSnapshot(
                machine_id=machine_id,
                gpu_name=rng.choice(MODELS),
                free_gpu_ids=tuple(range(gpu_id, gpu_id + count)),
                price_per_gpu_hour=rng.randrange(200_000, 3_000_000, 10_000),
                reliability=rng.uniform(0.85, 1.0),
                region=rng.choice(REGIONS),
            )
        )
        gpu_id += count
    asks = [
        PlacementRequest(
            gpu_count=rng.choice([1, 1, 2, 4, 8]),
            gpu_name=rng.choice([None, *MODELS]),
            max_price_per_gpu_hour=rng.choice([None, 1_000_000, 2_000_000]),
            min_reliability=rng.choice([0.0, 0.9, 0.95]),
            regions=rng.choice([None, frozenset({"US", "CA"}), frozenset({"EU"})]),
        )
        for _ in range(requests)
    ]
    started = time.perf_counter()
    planner = Planner(snapshot)
    placed = [planner.place(ask) for ask in asks]
    elapsed = time.perf_counter() - started
    gpus = [g for p in placed if p for g in p.gpu_ids]
    assert len(gpus) == len(set(gpus)), "a GPU was placed twice"
    rate = requests / elapsed
    print(
        f"placement: {machines:,} machines, {requests:,} requests in {elapsed:.3f}s (index build included)"
    )
    print(f"  {rate:,.0f} decisions/s   budget ≥ 5,000/s   ratio {rate / 5000:.2f}×")
    print(
        f"  placed {sum(p is not None for p in placed):,}, unplaceable {sum(p is None for p in placed):,}; no GPU placed twice"
    )


if __name__ == "__main__":
    main()
