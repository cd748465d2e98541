"""Placement over snapshots: cheapest fit, filters respected, never a GPU twice."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.placement import (
    BINPACK,
    CHEAPEST,
    SPREAD,
    Card,
    MachineSnapshot,
    PlacementRequest,
    Planner,
    SliceSize,
    place_all,
)
from tests.conftest import examples


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


@settings(max_examples=examples(60), deadline=None)
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


@settings(max_examples=examples(40), deadline=None)
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


# --- slices: two-tier placement ---------------------------------------------------------------

CARD = 24564


def sharing_machine(machine_id, gpus, price=500_000, min_core=10, sliced=()):
    """A sharing machine's snapshot; ``sliced`` is (card index, compute %, MB) already taken."""
    first = machine_id * 100
    ids = tuple(range(first, first + gpus))
    used = {first + index: (core, memory) for index, core, memory in sliced}
    cards = tuple(
        Card(i, 100 - used.get(i, (0, 0))[0], CARD - used.get(i, (0, 0))[1], CARD) for i in ids
    )
    whole = tuple(i for i in ids if i not in used)
    return MachineSnapshot(
        machine_id, "RTX 4090", whole, price, 0.99, "US", cards=cards,
        min_slice_core_percent=min_core,
    )  # fmt: skip


def slice_ask(core, memory=1024, policy=BINPACK, card_policy=BINPACK, **fields):
    return PlacementRequest(
        1, gpu_slice=SliceSize(core, memory), policy=policy, card_policy=card_policy, **fields
    )


def test_binpack_at_card_level_leaves_more_whole_cards_free_than_spread():
    """The same trace of slices over two 4-card machines: card-level binpack stacks them and
    keeps cards whole for whole-GPU renters; spread puts each on the emptiest card."""
    trace = [25, 25, 50, 10, 40, 25, 25, 30, 20, 50]
    whole_free = {}
    for card_policy in (BINPACK, SPREAD):
        planner = Planner([sharing_machine(1, 4), sharing_machine(2, 4, price=600_000)])
        placed = [planner.place(slice_ask(core, card_policy=card_policy)) for core in trace]
        assert all(p is not None and p.gpu_slice is not None for p in placed)
        cards = {card for p in placed for card in p.gpu_ids}
        whole_free[card_policy] = 8 - len(cards)
        # What stays whole is what whole renters get.
        big = planner.place(PlacementRequest(gpu_count=whole_free[card_policy]))
        assert big is None or not cards & set(big.gpu_ids)
    # 300 % of slices: binpack fills three cards of the first machine; spread touches all four
    # of its cards (the machine-level policy, binpack, keeps both on the first machine).
    assert whole_free[BINPACK] == 5 and whole_free[SPREAD] == 4


def test_machine_level_binpack_fills_the_fullest_sharing_machine_spread_the_emptiest():
    machines = [
        sharing_machine(1, 2),
        sharing_machine(2, 2, sliced=[(0, 60, 1024), (1, 100, CARD)]),
        sharing_machine(3, 1, sliced=[(0, 10, 1024)]),
    ]
    assert Planner(machines).place(slice_ask(30)).machine_id == 2  # its best card: 40 % free
    assert Planner(machines).place(slice_ask(30, policy=SPREAD)).machine_id == 1
    assert Planner(machines).place(slice_ask(50)).machine_id == 3  # 90 % free beats 100 %


def test_slices_and_whole_gpus_never_share_a_card_and_a_card_never_overfills():
    planner = Planner([sharing_machine(1, 2, min_core=20)])
    assert planner.place(slice_ask(10)) is None  # under the machine's smallest slice
    first = planner.place(slice_ask(60))
    assert planner.place(PlacementRequest(gpu_count=2)) is None  # one card is sliced now
    whole = planner.place(PlacementRequest(gpu_count=1))
    assert whole.gpu_ids != first.gpu_ids
    assert planner.place(slice_ask(50)) is None  # 40 % left on the sliced card, none elsewhere
    assert planner.place(slice_ask(40, memory=CARD)) is None  # memory counts too
    assert planner.place(slice_ask(40)).gpu_ids == first.gpu_ids
    # Given back, a slice's card is whole again once its last slice is gone.
    planner.release(1, whole.gpu_ids)
    planner.release_slice(1, first.gpu_ids[0], SliceSize(60, 1024))
    assert planner.place(PlacementRequest(gpu_count=2)) is None
    planner.release_slice(1, first.gpu_ids[0], SliceSize(40, 1024))
    assert planner.place(PlacementRequest(gpu_count=2)).gpu_ids == (100, 101)


@settings(max_examples=examples(60))
@given(
    asks=st.lists(
        st.tuples(st.booleans(), st.integers(1, 100), st.integers(1, CARD), st.integers(1, 3)),
        max_size=60,
    ),
    policy=st.sampled_from([CHEAPEST, BINPACK, SPREAD]),
    card_policy=st.sampled_from([BINPACK, SPREAD]),
)
def test_no_card_ever_goes_over_100_percent_or_is_both(asks, policy, card_policy):
    planner = Planner([sharing_machine(m, 3, min_core=1) for m in (1, 2)])
    core, memory, whole = {}, {}, set()
    for is_slice, percent, mb, count in asks:
        if is_slice:
            placed = planner.place(slice_ask(percent, mb, policy, card_policy))
            if placed:
                [card] = placed.gpu_ids
                core[card] = core.get(card, 0) + percent
                memory[card] = memory.get(card, 0) + mb
        else:
            placed = planner.place(PlacementRequest(gpu_count=count, policy=policy))
            if placed:
                assert whole.isdisjoint(placed.gpu_ids)
                whole.update(placed.gpu_ids)
    assert all(v <= 100 for v in core.values()) and all(v <= CARD for v in memory.values())
    assert whole.isdisjoint(core)


def test_a_planner_never_changes_the_snapshot_it_was_given():
    """A planner's slices change its own copies of the cards: a second planner over the same
    snapshot sees every card as the snapshot says, and decides as the first did."""
    snapshot = [sharing_machine(1, 2), sharing_machine(2, 2, sliced=[(0, 30, 1024)])]
    before = [(c.gpu_id, c.free_core, c.free_memory_mb) for m in snapshot for c in m.cards]
    asks = [slice_ask(40), slice_ask(70), PlacementRequest(gpu_count=1), slice_ask(30)]
    planner = Planner(snapshot)
    decided = [planner.place(a) for a in asks]
    assert all(decided)
    planner.release_slice(decided[0].machine_id, decided[0].gpu_ids[0], SliceSize(40, 1024))
    assert [(c.gpu_id, c.free_core, c.free_memory_mb) for m in snapshot for c in m.cards] == before
    assert place_all(snapshot, asks) == decided
