"""Fragmentation: does ``binpack`` keep big machines whole where ``spread`` scatters replicas?

Pure, no database. A fleet of mixed machines (mostly 8-GPU, some 1/2/4-GPU) and ONE seeded
trace of arrivals and departures (1–8 GPUs, mostly small; each request belongs to one of a
few hundred deployments) are replayed through ``scheduler.placement.Planner`` once per
policy, with ``Planner.place`` for arrivals and ``Planner.release`` for departures. Under
``spread`` each request avoids the machines already running a replica of its deployment.

Reported per policy: the 8-GPU machines left whole (all 8 GPUs free), averaged over the
trace (sampled after every event) and at the end, and the requests that could not be
placed (the trace goes on without them).

Budget (issue 12): binpack keeps more 8-GPU machines whole than spread (exit 1 otherwise).

    .venv/bin/python bench/fragmentation.py [--events 40000] [--seed 12]
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import budget_row  # noqa: E402

from scheduler.placement import (  # noqa: E402
    BINPACK,
    SPREAD,
    MachineSnapshot,
    PlacementRequest,
    Planner,
)

# Fleet: (GPUs per machine, how many machines).
FLEET = [(8, 600), (4, 150), (2, 150), (1, 200)]
# Request sizes, mostly small.
SIZES, SIZE_WEIGHTS = [1, 2, 4, 8], [55, 25, 13, 7]
DEPLOYMENTS = 300
TARGET_LOAD = 0.65  # share of the fleet's GPUs the trace keeps busy on average


@dataclass(frozen=True)
class Arrival:
    request_id: int
    deployment: int
    gpu_count: int
    arrives_at: float
    departs_at: float


def build_fleet(rng: random.Random) -> list[MachineSnapshot]:
    machines, gpu_id = [], 0
    for size, count in FLEET:
        for _ in range(count):
            machines.append(
                MachineSnapshot(
                    machine_id=len(machines),
                    gpu_name="H100-SXM5-80GB",
                    free_gpu_ids=tuple(range(gpu_id, gpu_id + size)),
                    price_per_gpu_hour=rng.randrange(2_000_000, 3_500_000, 10_000),
                    reliability=round(rng.uniform(0.9, 1.0), 4),
                )
            )
            gpu_id += size
    return machines


def build_trace(rng: random.Random, events: int, capacity: int) -> list[Arrival]:
    """Poisson arrivals, exponential lifetimes, sized so the offered load is TARGET_LOAD."""
    mean_size = sum(s * w for s, w in zip(SIZES, SIZE_WEIGHTS, strict=True)) / sum(SIZE_WEIGHTS)
    mean_life = 1.0
    rate = TARGET_LOAD * capacity / (mean_size * mean_life)  # arrivals per unit time
    arrivals, now = [], 0.0
    for request_id in range(events // 2):  # each request arrives and (usually) departs
        now += rng.expovariate(rate)
        arrivals.append(
            Arrival(
                request_id=request_id,
                deployment=rng.randrange(DEPLOYMENTS),
                gpu_count=rng.choices(SIZES, SIZE_WEIGHTS)[0],
                arrives_at=now,
                departs_at=now + rng.expovariate(1 / mean_life),
            )
        )
    return arrivals


def replay(policy: str, machines: list[MachineSnapshot], trace: list[Arrival]) -> dict:
    planner = Planner(machines)
    total = {m.machine_id: len(m.free_gpu_ids) for m in machines}
    free = dict(total)
    eights = {m for m, n in total.items() if n == 8}
    whole = len(eights)
    running: dict[int, Counter[int]] = {}  # deployment -> machine -> replicas there
    departures: list[tuple[float, int, int, tuple[int, ...], int]] = []
    unplaced = placed = 0
    whole_sum = samples = 0
    seen: set[int] = set()  # GPUs busy right now, to check nothing is double-booked

    def sample() -> None:
        nonlocal whole_sum, samples
        whole_sum += whole
        samples += 1

    def depart(machine_id: int, gpu_ids: tuple[int, ...], deployment: int) -> None:
        nonlocal whole
        planner.release(machine_id, gpu_ids)
        seen.difference_update(gpu_ids)
        free[machine_id] += len(gpu_ids)
        if machine_id in eights and free[machine_id] == 8:
            whole += 1
        counts = running[deployment]
        counts[machine_id] -= 1
        if not counts[machine_id]:
            del counts[machine_id]

    for arrival in trace:
        while departures and departures[0][0] <= arrival.arrives_at:
            _, _, machine_id, gpu_ids, deployment = heapq.heappop(departures)
            depart(machine_id, gpu_ids, deployment)
            sample()
        counts = running.setdefault(arrival.deployment, Counter())
        avoid = frozenset(counts) if policy == SPREAD else frozenset()
        placement = planner.place(
            PlacementRequest(gpu_count=arrival.gpu_count, policy=policy, avoid_machine_ids=avoid)
        )
        if placement is None:
            unplaced += 1
        else:
            placed += 1
            assert len(placement.gpu_ids) == arrival.gpu_count
            assert seen.isdisjoint(placement.gpu_ids), "a GPU was placed twice"
            seen.update(placement.gpu_ids)
            machine_id = placement.machine_id
            if machine_id in eights and free[machine_id] == 8:
                whole -= 1
            free[machine_id] -= arrival.gpu_count
            counts[machine_id] += 1
            heapq.heappush(
                departures,
                (arrival.departs_at, arrival.request_id, machine_id, placement.gpu_ids, arrival.deployment),
            )  # fmt: skip
        sample()
    # The end of the trace: what is still running stays (the fleet as it stands then).
    whole_end = whole
    busy = sum(total.values()) - sum(free.values())
    return {
        "whole_mean": whole_sum / samples,
        "whole_end": whole_end,
        "unplaced": unplaced,
        "placed": placed,
        "busy_end": busy,
        "eights": len(eights),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=40_000, help="arrivals + departures")
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    machines = build_fleet(rng)
    capacity = sum(len(m.free_gpu_ids) for m in machines)
    trace = build_trace(rng, args.events, capacity)
    print(
        f"fragmentation: {len(machines):,} machines ({', '.join(f'{c}×{s}-GPU' for s, c in FLEET)};"
        f" {capacity:,} GPUs), one trace of {len(trace):,} requests over {DEPLOYMENTS}"
        f" deployments (sizes {SIZES} weighted {SIZE_WEIGHTS}, offered load {TARGET_LOAD:.0%}),"
        f" seed {args.seed}"
    )
    results = {}
    for policy in (BINPACK, SPREAD):
        started = time.perf_counter()
        r = results[policy] = replay(policy, machines, trace)
        elapsed = time.perf_counter() - started
        print(
            f"  {policy:8} 8-GPU machines whole: mean {r['whole_mean']:7.1f} of {r['eights']},"
            f" at the end {r['whole_end']:4d};  unplaced {r['unplaced']:,} of {len(trace):,}"
            f" ({r['unplaced'] / len(trace):.2%});  GPUs busy at the end {r['busy_end']:,}"
            f"  [{elapsed:.2f}s]"
        )
    binpack, spread = results[BINPACK], results[SPREAD]
    ratio = binpack["whole_mean"] / spread["whole_mean"] if spread["whole_mean"] else float("inf")
    ok = binpack["whole_mean"] > spread["whole_mean"] and binpack["whole_end"] > spread["whole_end"]
    print(
        f"  budget: binpack keeps more 8-GPU machines whole than spread →"
        f" mean ratio {ratio:.2f}× (end {binpack['whole_end']} vs {spread['whole_end']})"
        f"  {'within budget' if ok else 'OVER BUDGET'}"
    )
    budget_row(
        "fragmentation.py", budget="binpack keeps more 8-GPU machines whole than spread",
        figure=f"{binpack['whole_mean']:.1f} vs {spread['whole_mean']:.1f} whole on average,"
        f" {binpack['whole_end']} vs {spread['whole_end']} at the end",
        floor="spread's figure", ratio=ratio, within=ok,
    )  # fmt: skip
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
