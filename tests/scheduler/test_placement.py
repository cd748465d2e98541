"""Placement over snapshots: cheapest fit, filters respected, never a GPU twice."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.placement import MachineSnapshot, PlacementRequest, Planner, place_all


def machine(machine_id, gpus, price, reliability=0.99, name="RTX 4090", region="US", first=None):
    first = machine_id * 100 if first is None else first
    return MachineSnapshot(
        machine_id, name, tuple(range(first, first + gpus)), price, reliability, region
    )


def test_cheapest_machine_that_fits_wins():
    planner = Planner([machine(1, 8, 900_000), machine(2, 2, 400_000), machine(3, 1, 300_000)])
    assert planner.place(PlacementRequest(gpu_count=2)).machine_id == 2


def test_filters_model_price_reliability_and_region():
    machines = [
        machine(1, 4, 100_000, reliability=0.5),
        machine(2, 4, 200_000, region="EU"),
        machine(3, 4, 300_000, name="A100"),
        machine(4, 4, 400_000),
    ]
    ask = PlacementRequest(
        gpu_count=1, gpu_name="RTX 4090", min_reliability=0.9, regions=frozenset({"US"})
    )
    assert Planner(machines).place(ask).machine_id == 4
    assert (
        Planner(machines).place(PlacementRequest(gpu_count=1, max_price_per_gpu_hour=50_000))
        is None
    )


def test_a_full_machine_is_not_chosen_again_and_release_frees_it():
    planner = Planner([machine(1, 2, 100_000)])
    first = planner.place(PlacementRequest(gpu_count=2))
    assert first.gpu_ids == (100, 101)
    assert planner.place(PlacementRequest(gpu_count=1)) is None
    planner.release(1, first.gpu_ids)
    assert planner.place(PlacementRequest(gpu_count=1)).gpu_ids == (100,)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=30),
    asks=st.lists(st.integers(min_value=1, max_value=8), max_size=60),
)
def test_no_gpu_is_ever_placed_twice_and_counts_are_exact(sizes, asks):
    machines = [machine(i, size, 100_000 + i) for i, size in enumerate(sizes)]
    placed = place_all(machines, [PlacementRequest(gpu_count=n) for n in asks])
    gpus = [g for p in placed if p for g in p.gpu_ids]
    assert len(gpus) == len(set(gpus))
    for ask, placement in zip(asks, placed, strict=True):
        if placement is not None:
            assert len(placement.gpu_ids) == ask


def test_binpack_fills_the_fullest_machine_first_and_keeps_big_ones_whole():
    machines = [machine(1, 8, 100_000), machine(2, 3, 300_000), machine(3, 2, 500_000)]
    planner = Planner(machines)
    ask = PlacementRequest(gpu_count=2, policy="binpack")
    # Fewest free GPUs first, whatever the price: the 2-GPU machine, then the 3-GPU one.
    assert planner.place(ask).machine_id == 3
    assert planner.place(ask).machine_id == 2
    # The 3-GPU machine has one left, too few: only now is the big machine cut into.
    assert planner.place(ask).machine_id == 1
    # Among equally full machines, the cheaper one.
    even = Planner([machine(1, 2, 300_000), machine(2, 2, 200_000)])
    assert even.place(ask).machine_id == 2


def test_spread_avoids_machines_the_deployment_runs_on_unless_nothing_else_fits():
    machines = [machine(1, 4, 100_000), machine(2, 4, 200_000), machine(3, 4, 300_000)]
    planner = Planner(machines)
    placed: set[int] = set()
    for _ in range(3):
        ask = PlacementRequest(gpu_count=1, policy="spread", avoid_machine_ids=frozenset(placed))
        placed.add(planner.place(ask).machine_id)
    assert placed == {1, 2, 3}
    # Every machine runs one: the fourth goes to the cheapest that still fits.
    ask = PlacementRequest(gpu_count=1, policy="spread", avoid_machine_ids=frozenset(placed))
    assert planner.place(ask).machine_id == 1
    # The cheapest policy ignores the avoided set.
    cheapest = Planner(machines).place(
        PlacementRequest(gpu_count=1, avoid_machine_ids=frozenset({1}))
    )
    assert cheapest.machine_id == 1


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=20),
    asks=st.lists(st.integers(min_value=1, max_value=8), max_size=40),
    policy=st.sampled_from(["cheapest", "binpack", "spread"]),
)
def test_every_policy_places_what_fits_and_never_a_gpu_twice(sizes, asks, policy):
    machines = [machine(i, size, 100_000 + i) for i, size in enumerate(sizes)]
    planner = Planner(machines)
    used: set[int] = set()
    gpus: list[int] = []
    for n in asks:
        free_before = {m.machine_id: len(planner._free[m.machine_id]) for m in machines}
        ask = PlacementRequest(gpu_count=n, policy=policy, avoid_machine_ids=frozenset(used))
        placement = planner.place(ask)
        if placement is None:
            assert max(free_before.values()) < n  # nothing fitted
            continue
        assert len(placement.gpu_ids) == n
        if policy == "binpack":
            assert free_before[placement.machine_id] == min(
                f for f in free_before.values() if f >= n
            )
        used.add(placement.machine_id)
        gpus.extend(placement.gpu_ids)
    assert len(gpus) == len(set(gpus))
