"""Placement: pure functions over snapshots, no database, no I/O.

Given a snapshot of machines (free GPUs, price, reliability, region) and a request (how many
GPUs of which model, price ceiling, reliability floor, regions), choose a machine and its
GPUs. The request's policy says which of the machines that fit:

- ``cheapest`` (the default): the cheapest, ties broken by reliability, then by the fewest free
  GPUs left over (so big machines stay free for big requests);
- ``binpack``: the fewest free GPUs first, then the cheapest, so machines fill up and big ones
  stay whole;
- ``spread``: as ``cheapest``, but machines in ``avoid_machine_ids`` (those already running a
  replica of the same deployment) only when no other machine fits.

The planner updates its own snapshot as it places, so a batch of requests never double-books
a GPU.

Slices (fractional GPUs) are placed at two tiers, each with its own policy: the machine (the
request's ``policy``: ``binpack`` the machine whose best card has the least room that fits,
``spread`` the one with the most, ``cheapest`` the cheapest) and then the card on it
(``card_policy``: ``binpack`` the fullest card that fits, ``spread`` the emptiest). A slice on
a whole free card takes that card from whole-GPU requests, and a whole-GPU request takes its
cards from slices, in the same snapshot.

Used where the platform picks the machine (elastic deployments, automatic restarts); a
renter who picks an offer picks the machine themselves.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction


def gpu_family_matches(wanted: str, name: str) -> bool:
    """Whether the GPU model ``name`` is ``wanted`` or one of its family, as a renter means it:
    "A100" is "A100-SXM4-80GB" and "A100 PCIE 40GB" too; "RTX 4090" is not "RTX 40". Case is
    ignored."""
    wanted, name = wanted.strip().upper(), name.strip().upper()
    return name == wanted or name.startswith((f"{wanted}-", f"{wanted} "))


@dataclass(frozen=True)
class MachineSnapshot:
    machine_id: int
    gpu_name: str
    free_gpu_ids: tuple[int, ...]
    price_per_gpu_hour: int
    reliability: float
    region: str = ""
    min_gpus: int = 1  # the machine rents at least this many GPUs at a time
    disk_per_gpu_gb: float = float("inf")
    # A machine that shares its cards: each card no whole rental holds, with what its slices
    # leave free (whole free cards are in ``free_gpu_ids`` too), and the smallest slice's
    # compute percent it takes. Empty for a machine that does not share.
    cards: tuple = ()
    min_slice_core_percent: int = 1


CHEAPEST, BINPACK, SPREAD = "cheapest", "binpack", "spread"
POLICIES = (CHEAPEST, BINPACK, SPREAD)
CARD_POLICIES = (BINPACK, SPREAD)


@dataclass(frozen=True)
class SliceSize:
    """A slice of one card asked for: a percentage of its compute and MB of its memory."""

    core_percent: int
    memory_mb: int


def slice_fraction(core_percent: int, memory_mb: int, card_memory_mb: int) -> Fraction:
    """How much of one card a slice counts as: the larger of its compute and memory shares.
    It is priced at the card's rate times this, and gets this much of one unit's CPU, RAM,
    shared memory and disk."""
    return max(Fraction(core_percent, 100), Fraction(memory_mb, max(card_memory_mb, 1)))


class Card:
    """A card of a sharing machine as slices see it: what of its compute (percent) and memory
    (MB, as nvidia-smi counts MiB) no slice holds. A card rented whole is not a Card at all;
    one with nothing taken is ``whole_free``, and a slice on it takes it from whole renting."""

    __slots__ = ("gpu_id", "free_core", "free_memory_mb", "memory_mb")

    def __init__(self, gpu_id: int, free_core: int, free_memory_mb: int, memory_mb: int):
        self.gpu_id = gpu_id
        self.free_core = free_core
        self.free_memory_mb = free_memory_mb
        self.memory_mb = memory_mb

    @property
    def whole_free(self) -> bool:
        return self.free_core == 100 and self.free_memory_mb == self.memory_mb

    def fits(self, core_percent: int, memory_mb: int) -> bool:
        return self.free_core >= core_percent and self.free_memory_mb >= memory_mb

    def take(self, core_percent: int, memory_mb: int) -> None:
        self.free_core -= core_percent
        self.free_memory_mb -= memory_mb

    def give_back(self, core_percent: int, memory_mb: int) -> None:
        self.free_core += core_percent
        self.free_memory_mb += memory_mb


def pick_card(cards, core_percent: int, memory_mb: int, policy: str = BINPACK) -> Card | None:
    """The card a slice goes on, among those it fits: ``binpack`` the fullest (least compute
    free, then least memory), keeping other cards whole for whole-GPU renters; ``spread`` the
    emptiest, so slices contend less. Ties go to the lowest GPU id."""
    best, best_rank = None, None
    for card in cards:
        if not card.fits(core_percent, memory_mb):
            continue
        rank = (card.free_core, card.free_memory_mb, card.gpu_id)
        if policy == SPREAD:
            rank = (-card.free_core, -card.free_memory_mb, card.gpu_id)
        if best_rank is None or rank < best_rank:
            best, best_rank = card, rank
    return best


@dataclass(frozen=True)
class PlacementRequest:
    gpu_count: int
    gpu_name: str | None = None
    gpu_names: frozenset[str] | None = None  # any of these models (with or beside gpu_name)
    max_price_per_gpu_hour: int | None = None
    min_reliability: float = 0.0
    regions: frozenset[str] | None = None
    policy: str = CHEAPEST
    avoid_machine_ids: frozenset[int] = frozenset()
    min_disk_per_gpu_gb: float = 0.0
    gpu_slice: SliceSize | None = None  # a slice of one card instead of gpu_count whole GPUs
    card_policy: str = "binpack"


@dataclass(frozen=True)
class Placement:
    machine_id: int
    gpu_ids: tuple[int, ...]  # a slice's: its one card
    gpu_slice: SliceSize | None = None


class Planner:
    """Indexes machines by GPU model and free count, each bucket sorted by price.

    A decision looks at most at one bucket head per (model, free count ≥ needed), skipping
    entries that fail the filters, so it stays fast with 10,000 machines.
    """

    def __init__(self, machines: list[MachineSnapshot]):
        self._free: dict[int, list[int]] = {}
        self._info: dict[int, MachineSnapshot] = {}
        # (gpu_name, free_count) -> sorted list of (price, -reliability, machine_id)
        self._buckets: dict[tuple[str, int], list[tuple[int, float, int]]] = defaultdict(list)
        self._names: set[str] = set()
        self._names_wanted: dict[tuple, list[str]] = {}  # a request's models: the names that match
        self._most_free = 0  # no bucket holds machines with more free GPUs than this
        # Sharing machines: their cards and, per (gpu_name, most compute percent free on one
        # card), the machines sorted as the whole buckets are. A machine's cards are the
        # snapshot's own until a slice changes one: then the planner's copies (``_owned``), so
        # a planner costs no copy of the cards it never touches.
        self._cards: dict[int, list[Card]] = {}
        self._owned: set[int] = set()
        self._best_core: dict[int, int] = {}
        self._slice_buckets: dict[tuple[str, int], list[tuple[int, float, int]]] = defaultdict(list)
        # Which "most compute free" values have machines, per model (a slice's search walks
        # these, not every percent from its size to 100).
        self._slice_cores: dict[str, set[int]] = defaultdict(set)
        for machine in machines:  # filled unsorted, sorted once below
            machine_id = machine.machine_id
            self._info[machine_id] = machine
            free = sorted(machine.free_gpu_ids)
            self._free[machine_id] = free
            self._names.add(machine.gpu_name)
            key = self._key(machine)
            if free:
                self._most_free = max(self._most_free, len(free))
                self._buckets[(machine.gpu_name, len(free))].append(key)
            if machine.cards:
                self._cards[machine_id] = list(machine.cards)
                best = max(c.free_core for c in machine.cards)
                self._best_core[machine_id] = best
                if best:
                    self._slice_buckets[(machine.gpu_name, best)].append(key)
                    self._slice_cores[machine.gpu_name].add(best)
        for bucket in (*self._buckets.values(), *self._slice_buckets.values()):
            bucket.sort()

    def _key(self, machine: MachineSnapshot) -> tuple[int, float, int]:
        return (machine.price_per_gpu_hour, -machine.reliability, machine.machine_id)

    def _insert(self, machine: MachineSnapshot) -> None:
        free = len(self._free[machine.machine_id])
        self._most_free = max(self._most_free, free)
        if free:
            bisect.insort(self._buckets[(machine.gpu_name, free)], self._key(machine))

    def _remove(self, machine: MachineSnapshot, free: int) -> None:
        bucket = self._buckets[(machine.gpu_name, free)]
        index = bisect.bisect_left(bucket, self._key(machine))
        del bucket[index]

    def _slice_insert(self, machine: MachineSnapshot) -> None:
        best = max((c.free_core for c in self._cards[machine.machine_id]), default=0)
        self._best_core[machine.machine_id] = best
        if best:
            bisect.insort(self._slice_buckets[(machine.gpu_name, best)], self._key(machine))
            self._slice_cores[machine.gpu_name].add(best)

    def _slice_remove(self, machine: MachineSnapshot) -> None:
        best = self._best_core.get(machine.machine_id, 0)
        if best:
            bucket = self._slice_buckets[(machine.gpu_name, best)]
            del bucket[bisect.bisect_left(bucket, self._key(machine))]
            if not bucket:
                self._slice_cores[machine.gpu_name].discard(best)
        self._best_core[machine.machine_id] = 0

    def _own_cards(self, machine_id: int) -> list[Card]:
        """The machine's cards as the planner's own copies, made on the first change."""
        if machine_id not in self._owned:
            self._cards[machine_id] = [
                Card(c.gpu_id, c.free_core, c.free_memory_mb, c.memory_mb)
                for c in self._cards[machine_id]
            ]
            self._owned.add(machine_id)
        return self._cards[machine_id]

    def place(self, request: PlacementRequest) -> Placement | None:
        if request.policy not in POLICIES:
            raise ValueError(f"unknown placement policy {request.policy!r}")
        if request.gpu_slice is not None:
            return self._place_slice(request)
        best = None
        if request.policy == SPREAD and request.avoid_machine_ids:
            best = self._best(request, avoid=request.avoid_machine_ids)
        if best is None:
            best = self._best(request, avoid=frozenset())
        if best is None:
            return None
        (_, _, machine_id), free = best
        machine = self._info[machine_id]
        self._remove(machine, free)
        taken = tuple(self._free[machine_id][: request.gpu_count])
        self._free[machine_id] = self._free[machine_id][request.gpu_count :]
        self._insert(machine)
        if machine_id in self._cards:  # whole-rented cards are no longer there for slices
            self._slice_remove(machine)
            self._cards[machine_id] = [c for c in self._cards[machine_id] if c.gpu_id not in taken]
            self._slice_insert(machine)
        return Placement(machine_id=machine_id, gpu_ids=taken)

    def _place_slice(self, request: PlacementRequest) -> Placement | None:
        size = request.gpu_slice
        best = None
        if request.policy == SPREAD and request.avoid_machine_ids:
            best = self._best_slice_machine(request, avoid=request.avoid_machine_ids)
        if best is None:
            best = self._best_slice_machine(request, avoid=frozenset())
        if best is None:
            return None
        machine = self._info[best]
        card = pick_card(
            self._own_cards(best), size.core_percent, size.memory_mb, request.card_policy
        )
        self._slice_remove(machine)
        if card.whole_free:  # a slice takes the card from whole renting
            self._remove(machine, len(self._free[best]))
            self._free[best].remove(card.gpu_id)
            self._insert(machine)
        card.take(size.core_percent, size.memory_mb)
        self._slice_insert(machine)
        return Placement(machine_id=best, gpu_ids=(card.gpu_id,), gpu_slice=size)

    def _best_slice_machine(self, request: PlacementRequest, avoid: frozenset[int]) -> int | None:
        """The machine the policy prefers among those with a card the slice fits on: buckets by
        the most compute free on one card, fullest first for binpack, emptiest first for
        spread, all of them for cheapest (then the cheapest)."""
        size = request.gpu_slice
        terms = self._terms(request)
        names = self._names_for(request)
        present = set().union(*(self._slice_cores.get(name, ()) for name in names))
        cores = sorted(
            (c for c in present if c >= size.core_percent), reverse=request.policy == SPREAD
        )
        best, best_rank = None, None
        for core in cores:
            for name in names:
                bucket = self._slice_buckets.get((name, core))
                if not bucket or bucket[0][0] > terms[0]:  # none at or under the price
                    continue
                candidate = self._first_fit(bucket, terms, avoid)
                if candidate is None:
                    continue
                rank = candidate if request.policy == CHEAPEST else (core, *candidate)
                if best_rank is None or rank < best_rank:
                    best, best_rank = candidate[2], rank
                    terms = (candidate[0], *terms[1:])  # a dearer one cannot rank before it
            if best is not None and request.policy != CHEAPEST:
                return best  # no later bucket ranks before this one
        return best

    def release_slice(self, machine_id: int, gpu_id: int, size: SliceSize) -> None:
        """Give back a slice placed here whose rental was refused after all."""
        machine = self._info[machine_id]
        card = next(c for c in self._own_cards(machine_id) if c.gpu_id == gpu_id)
        self._slice_remove(machine)
        card.give_back(size.core_percent, size.memory_mb)
        self._slice_insert(machine)
        if card.whole_free:
            self.release(machine_id, (gpu_id,))

    def _best(self, request: PlacementRequest, avoid: frozenset[int]):
        """(sort key, free count) of the machine the policy prefers, or None."""
        best, best_rank = None, None
        terms = self._terms(request)
        names = self._names_for(request)
        for free in range(request.gpu_count, self._most_free + 1):
            for name in names:
                bucket = self._buckets.get((name, free))
                if not bucket or bucket[0][0] > terms[0]:  # none at or under the price
                    continue
                candidate = self._first_fit(bucket, terms, avoid)
                if candidate is None:
                    continue
                price, negative_reliability, machine_id = candidate
                if request.policy == BINPACK:
                    rank = (free, price, negative_reliability, machine_id)
                else:
                    rank = (price, negative_reliability, free, machine_id)
                if best_rank is None or rank < best_rank:
                    best, best_rank = (candidate, free), rank
                    terms = (price, *terms[1:])  # a dearer one cannot rank before it
            if best is not None and request.policy == BINPACK:
                return best  # no bucket with more free GPUs ranks before this one
        return best

    def _names_for(self, request: PlacementRequest):
        if not (request.gpu_name or request.gpu_names):
            return self._names
        asked = (request.gpu_name, request.gpu_names)
        names = self._names_wanted.get(asked)
        if names is None:  # the machines' models never change in a planner: worked out once
            wanted = {*(request.gpu_names or ()), *([request.gpu_name] if request.gpu_name else [])}
            names = sorted(n for n in self._names if any(gpu_family_matches(w, n) for w in wanted))
            self._names_wanted[asked] = names
        return names

    @staticmethod
    def _terms(request: PlacementRequest) -> tuple:
        """What ``_first_fit`` compares, in the order it unpacks it."""
        size = request.gpu_slice
        return (
            float("inf")
            if request.max_price_per_gpu_hour is None
            else request.max_price_per_gpu_hour,
            -request.min_reliability,  # bucket entries hold reliability negated
            request.regions or None,
            size,
            request.gpu_count,
            request.min_disk_per_gpu_gb,
            size.core_percent if size is not None else 0,
            size.memory_mb if size is not None else 0,
        )

    def _first_fit(self, bucket, terms: tuple, avoid: frozenset[int]):
        """The first machine of a price-sorted bucket that meets the request's conditions and
        the machine's own terms for its size, or None: for whole GPUs its smallest rental and
        disk per GPU; for a slice its smallest slice and a card with room for it.

        The loop that most decisions spend their time in: what it compares comes read out of
        the request once per decision (``_terms``), not for each bucket or machine."""
        max_price, worst, regions, size, count, disk, core, memory = terms
        info_of = self._info
        for entry in bucket:
            price, negative_reliability, machine_id = entry
            if price > max_price:
                return None  # sorted by price: nothing further is cheaper
            if negative_reliability > worst or (avoid and machine_id in avoid):
                continue
            info = info_of[machine_id]
            if regions is not None and info.region not in regions:
                continue
            if size is None:
                if info.min_gpus > count or info.disk_per_gpu_gb < disk:
                    continue
            elif info.min_slice_core_percent > core or not any(
                c.free_core >= core and c.free_memory_mb >= memory for c in self._cards[machine_id]
            ):
                continue
            return entry
        return None

    def forget(self, machine_id: int) -> None:
        """Place nothing more on the machine (it refused a rental: taken, gone offline)."""
        machine = self._info.get(machine_id)
        free = len(self._free.get(machine_id, ()))
        if machine is not None and free:
            self._remove(machine, free)
            self._free[machine_id] = []
        if machine is not None and machine_id in self._cards:
            self._slice_remove(machine)
            self._cards[machine_id] = []

    def release(self, machine_id: int, gpu_ids: tuple[int, ...]) -> None:
        """Give back whole GPUs placed here whose rental was refused after all (on a sharing
        machine they are cards for slices again)."""
        machine = self._info[machine_id]
        free = len(self._free[machine_id])
        if free:
            self._remove(machine, free)
        self._free[machine_id] = sorted({*self._free[machine_id], *gpu_ids})
        self._insert(machine)
        if machine_id in self._cards:
            known = {c.gpu_id for c in self._cards[machine_id]}
            shared = {c.gpu_id: c.memory_mb for c in machine.cards}  # the snapshot's
            back = [g for g in gpu_ids if g not in known and g in shared]
            if back:
                self._slice_remove(machine)
                cards = self._own_cards(machine_id)
                for gpu_id in back:
                    cards.append(Card(gpu_id, 100, shared[gpu_id], shared[gpu_id]))
                self._slice_insert(machine)


def place_all(
    machines: list[MachineSnapshot], requests: list[PlacementRequest]
) -> list[Placement | None]:
    planner = Planner(machines)
    return [planner.place(request) for request in requests]
