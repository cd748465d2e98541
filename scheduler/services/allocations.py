"""Allocations of GPUs, GPU slices and host ports to instances.

Allocation happens inside the caller's transaction with the machine row locked, so two renters
racing for the last GPU (or the last slice of a card) are serialized; the partial unique
constraints and the card triggers on the allocation tables are the backstop.
``live_gpu_allocations`` is the one query for whole GPUs held now, ``live_gpu_slices`` for
slices, and ``holding_gpus`` asks whether an instance holds either.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, Prefetch, Q, QuerySet, Sum
from django.utils import timezone

from core.pg_bulk import insert_models
from hosts.models import Gpu, Machine
from hosts.ports import PORT_REST, pick_free_ports
from scheduler.models import GpuAllocation, GpuSlice, Instance, PortAllocation
from scheduler.placement import BINPACK, Card, pick_card
from scheduler.services.errors import NoCapacity


def live_gpu_allocations() -> QuerySet[GpuAllocation]:
    return GpuAllocation.objects.filter(released_at=None)


def live_gpu_slices() -> QuerySet[GpuSlice]:
    return GpuSlice.objects.filter(released_at=None)


def holding_gpus(**lookups) -> Q:
    """Instances (``instance=OuterRef(...)`` and any other lookups both tables share) holding a
    whole GPU or a slice now."""
    return Q(Exists(live_gpu_allocations().filter(**lookups))) | Q(
        Exists(live_gpu_slices().filter(**lookups))
    )


def instance_holds_gpus(instance: Instance) -> bool:
    return (
        live_gpu_allocations().filter(instance=instance).exists()
        or live_gpu_slices().filter(instance=instance).exists()
    )


def sliced_gpu_ids(machine_ids) -> set[int]:
    """Cards that live slices hold (no whole-GPU rental may take them)."""
    return set(
        live_gpu_slices().filter(gpu__machine_id__in=machine_ids).values_list("gpu_id", flat=True)
    )


def machine_cards(machines: list[Machine]) -> dict[int, list[Card]]:
    """The cards slices may take on the sharing machines among ``machines``: every present card
    no whole-GPU rental holds, with what its live slices leave free. Two queries."""
    ids = [machine.pk for machine in machines if machine.sharing_enabled]
    cards: dict[int, list[Card]] = defaultdict(list)
    if not ids:
        return cards
    used = {
        row["gpu_id"]: (row["core"], row["memory"])
        for row in live_gpu_slices()
        .filter(gpu__machine_id__in=ids)
        .values("gpu_id")
        .annotate(core=Sum("core_percent"), memory=Sum("memory_mb"))
    }
    taken = live_gpu_allocations().filter(gpu=OuterRef("pk"))
    rows = (
        Gpu.objects.filter(machine_id__in=ids, present=True)
        .exclude(Exists(taken))
        .order_by("machine_id", "index")
        .values_list("machine_id", "pk", "memory_mib")
    )
    for machine_id, gpu_id, memory_mib in rows:
        core, memory = used.get(gpu_id, (0, 0))
        cards[machine_id].append(Card(gpu_id, 100 - core, memory_mib - memory, memory_mib))
    return cards


class SliceTaken:
    """A slice ``FreeCapacity.take_slice`` handed out: its card and its size."""

    __slots__ = ("gpu_id", "core_percent", "memory_mb", "was_whole_free")

    def __init__(self, gpu_id: int, core_percent: int, memory_mb: int, was_whole_free: bool):
        self.gpu_id = gpu_id
        self.core_percent = core_percent
        self.memory_mb = memory_mb
        self.was_whole_free = was_whole_free


class FreeCapacity:
    """What is free on locked machines now: their present GPUs no live allocation or slice
    holds (in index order), the cards of sharing machines with what their slices leave free,
    and their host ports in use, read in a few statements for any number of machines. ``take``
    and ``take_slice`` hand out GPUs, slices and ports in memory, so a batch of rentals on one
    machine never gets the same GPU, share of a card or port twice; ``allocations_write``
    writes what was taken. An order that may still be refused after taking (short of credit)
    takes inside a ``trial``, which keeps what it took only if committed.

    The caller holds the machines' row locks (``select_for_update``) in its transaction, so
    what is read stays true until it commits; the partial unique constraints on the
    allocation tables are the backstop.
    """

    def __init__(self, machines: list[Machine]):
        ids = [machine.pk for machine in machines]
        self._machines = {machine.pk: machine for machine in machines}
        # Slices live only on sharing machines (sharing cannot be turned off while any do).
        self.cards = machine_cards(machines)
        self._card_of = {card.gpu_id: card for cards in self.cards.values() for card in cards}
        sliced = {gpu_id for gpu_id, card in self._card_of.items() if not card.whole_free}
        self.present: dict[int, int] = defaultdict(int)
        self._gpu_order: dict[int, list[int]] = defaultdict(list)
        self.free_gpu_ids: dict[int, list[int]] = defaultdict(list)
        self.largest_card_memory_mb: dict[int, int] = defaultdict(int)
        self.gpu_uuid: dict[int, str] = {}  # a rent answers with its GPUs' uuids, not reading back
        for machine_id, gpu_id, is_taken, memory_mib, uuid in _present_gpus(ids):
            self.gpu_uuid[gpu_id] = uuid
            largest = self.largest_card_memory_mb[machine_id]
            self.largest_card_memory_mb[machine_id] = max(largest, memory_mib)
            self.present[machine_id] += 1
            self._gpu_order[machine_id].append(gpu_id)
            if not is_taken and gpu_id not in sliced:
                self.free_gpu_ids[machine_id].append(gpu_id)
        # The live ports, and those given back less than PORT_REST ago (hosts/ports.py): one
        # statement, over the live ports' index and the given-back ones' by time.
        self.used_ports: dict[int, set[int]] = defaultdict(set)
        self.resting_ports: dict[int, dict[int, datetime]] = defaultdict(dict)
        rested_since = timezone.now() - PORT_REST
        ports = PortAllocation.objects.filter(
            Q(released_at=None) | Q(released_at__gte=rested_since), machine_id__in=ids
        ).values_list("machine_id", "host_port", "released_at")
        for machine_id, port, released_at in ports:
            if released_at is None:
                self.used_ports[machine_id].add(port)
                continue
            resting = self.resting_ports[machine_id]
            resting[port] = max(resting.get(port, released_at), released_at)
        self._trial: CapacityTrial | None = None

    def take(
        self, machine_id: int, gpu_count: int, container_ports: list[int]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """(GPU ids, [(container port, host port)]) for one rental, or NoCapacity (nothing
        taken)."""
        free = self.free_gpu_ids[machine_id]
        if len(free) < gpu_count:
            raise NoCapacity(
                f"Only {len(free)} GPU(s) of machine {machine_id} are free now; "
                f"{gpu_count} were asked for."
            )
        machine = self._machines[machine_id]
        used = self.used_ports[machine_id]
        host_ports = pick_free_ports(
            machine.port_range_start, machine.port_range_end, used, len(container_ports),
            self.resting_ports[machine_id],
        )  # fmt: skip
        if len(host_ports) < len(container_ports):
            raise NoCapacity(f"Machine {machine_id} has no free host ports left.")
        gpu_ids = free[:gpu_count]
        del free[:gpu_count]
        used.update(host_ports)
        if machine_id in self.cards:  # whole cards are no longer there for slices
            self.cards[machine_id] = [c for c in self.cards[machine_id] if c.gpu_id not in gpu_ids]
        return gpu_ids, list(zip(container_ports, host_ports, strict=True))

    def take_slice(
        self, machine_id: int, core_percent: int, memory_mb: int, policy: str = BINPACK
    ) -> SliceTaken:
        """A slice of one card of the machine, the card chosen by ``policy`` (binpack: the
        fullest that fits; spread: the emptiest), or NoCapacity saying what is free."""
        cards = self.cards.get(machine_id, [])
        card = pick_card(cards, core_percent, memory_mb, policy)
        if card is None:
            best_core = max((c.free_core for c in cards), default=0)
            best_memory = max((c.free_memory_mb for c in cards), default=0)
            raise NoCapacity(
                f"No card of machine {machine_id} has {core_percent}% of its compute and "
                f"{memory_mb} MB free now (at most {best_core}% and {best_memory} MB free "
                "on one card)."
            )
        was_whole_free = card.whole_free
        card.take(core_percent, memory_mb)
        if was_whole_free:
            self.free_gpu_ids[machine_id].remove(card.gpu_id)
        return SliceTaken(card.gpu_id, core_percent, memory_mb, was_whole_free)

    def trial(self, machine_id: int) -> CapacityTrial:
        """One order's takes from the machine, kept only if committed (``CapacityTrial``)."""
        if self._trial is not None:
            raise RuntimeError("Another trial is still open; commit or drop it first.")
        self._trial = CapacityTrial(self, machine_id)
        return self._trial

    def gpu_uuids(self, machine_id: int, gpu_ids: list[int]) -> list[str]:
        """The uuids of GPUs of the machine, in index order (as ``instance_gpu_uuids``)."""
        wanted = set(gpu_ids)
        return [self.gpu_uuid[g] for g in self._gpu_order[machine_id] if g in wanted]

    def card_memory_mb(self, gpu_id: int) -> int:
        return self._card_of[gpu_id].memory_mb


class CapacityTrial:
    """One order's takes from one machine's free capacity, kept only if committed::

        with capacity.trial(machine_id) as trial:
            gpu_ids, ports = trial.take(2, [22])
            ...  # anything here may still refuse the order
            trial.commit()

    Leaving the block without ``commit`` (a refusal raised, or simply not committed) drops
    the trial: the machine's free GPUs (in their order), its cards and its host ports are as
    they were before it, whatever it took or was lent. One trial is open at a time, and while
    it is open only it takes from the machine."""

    def __init__(self, capacity: FreeCapacity, machine_id: int):
        self.capacity = capacity
        self.machine_id = machine_id
        self._free_before = list(capacity.free_gpu_ids[machine_id])
        self._cards_before = (
            list(capacity.cards[machine_id]) if machine_id in capacity.cards else None
        )
        self._slices: list[SliceTaken] = []
        self._ports: list[int] = []
        self._open = True

    @property
    def free_gpu_count(self) -> int:
        return len(self.capacity.free_gpu_ids[self.machine_id])

    def take(
        self, gpu_count: int, container_ports: list[int]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """``FreeCapacity.take`` on the trial's machine."""
        gpu_ids, ports = self.capacity.take(self.machine_id, gpu_count, container_ports)
        self._ports.extend(host_port for _, host_port in ports)
        return gpu_ids, ports

    def take_slice(self, core_percent: int, memory_mb: int, policy: str = BINPACK) -> SliceTaken:
        """``FreeCapacity.take_slice`` on the trial's machine."""
        slice_ = self.capacity.take_slice(self.machine_id, core_percent, memory_mb, policy)
        self._slices.append(slice_)
        return slice_

    def lend(self, gpu_ids: list[int]) -> None:
        """Count GPUs that an interruption in this transaction would free as free, after the
        ones that are (``take`` hands them out last): the interruption happens only if the
        trial is committed."""
        self.capacity.free_gpu_ids[self.machine_id].extend(gpu_ids)

    def commit(self) -> None:
        """Keep what the trial took: the order is accepted."""
        self._close()

    def drop(self) -> None:
        """Put back what the trial took and was lent: the order is refused."""
        self._close()
        capacity, machine_id = self.capacity, self.machine_id
        capacity.free_gpu_ids[machine_id][:] = self._free_before
        if self._cards_before is not None:
            capacity.cards[machine_id] = self._cards_before
        for slice_ in self._slices:
            capacity._card_of[slice_.gpu_id].give_back(slice_.core_percent, slice_.memory_mb)
        capacity.used_ports[machine_id].difference_update(self._ports)

    def _close(self) -> None:
        if not self._open:
            raise RuntimeError("This trial was committed or dropped already.")
        self._open = False
        self.capacity._trial = None

    def __enter__(self) -> CapacityTrial:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._open:
            self.drop()


def _present_gpus(machine_ids: list[int]) -> list[tuple]:
    """The machines' present GPUs in index order, and whether a whole-GPU rental holds each
    (``live_gpu_allocations``): (machine id, pk, taken, memory MiB, uuid).

    Written out rather than built by the ORM, whose building it on every rent cost several
    times the CPU that running it takes (figures in docs/benchmarks.md). Valid on PostgreSQL
    and SQLite alike."""
    if not machine_ids:  # every order was refused before its machine was locked
        return []
    sql = _PRESENT_GPUS_SQL.format(machines=", ".join(["%s"] * len(machine_ids)))
    with connection.cursor() as cursor:
        cursor.execute(sql, machine_ids)
        return cursor.fetchall()


_PRESENT_GPUS_SQL = f"""
SELECT g.machine_id, g.id,
       EXISTS (SELECT 1 FROM {GpuAllocation._meta.db_table} a
               WHERE a.gpu_id = g.id AND a.released_at IS NULL) AS taken,
       g.memory_mib, g.uuid
  FROM {Gpu._meta.db_table} g
 WHERE g.machine_id IN ({{machines}}) AND g.present
 ORDER BY g.machine_id, g."index"
"""  # noqa: S608  (table names from the models; values are parameters)


def allocations_write(
    rows: list[tuple[Instance, list[int], list[tuple[int, int]], SliceTaken | None]],
    *,
    savepoint: bool = True,
) -> None:
    """Write the GPU, slice and port allocations ``FreeCapacity`` handed out: (instance, GPU
    ids, [(container port, host port)], slice or None) per rental, in three statements.

    A batch of rents writes hundreds of rows: on PostgreSQL they load by binary COPY
    (``core.pg_bulk.insert_models``). A constraint violation is a clean 409 (NoCapacity): in a
    savepoint of its own, or, with ``savepoint=False``, for a caller whose transaction ends on
    any error from here (renting: two statements fewer per rent)."""
    try:
        with transaction.atomic(savepoint=savepoint):
            insert_models(
                GpuAllocation,
                [
                    GpuAllocation(instance=instance, gpu_id=gpu_id)
                    for instance, gpu_ids, _, _ in rows
                    for gpu_id in gpu_ids
                ],
            )
            slices = [
                GpuSlice(
                    instance=instance,
                    gpu_id=slice_.gpu_id,
                    core_percent=slice_.core_percent,
                    memory_mb=slice_.memory_mb,
                )
                for instance, _, _, slice_ in rows
                if slice_ is not None
            ]
            if slices:
                GpuSlice.objects.bulk_create(slices)
            insert_models(
                PortAllocation,
                [
                    PortAllocation(
                        instance=instance,
                        machine_id=instance.machine_id,
                        host_port=host_port,
                        container_port=container_port,
                    )
                    for instance, _, ports, _ in rows
                    for container_port, host_port in ports
                ],
            )
    except IntegrityError as error:
        raise NoCapacity("The GPUs were taken by another rental a moment ago.") from error


def gpu_allocation_release(*, instance: Instance) -> int:
    """Give back the instance's GPUs (or its slice); how many rows were released."""
    now = timezone.now()
    released = live_gpu_allocations().filter(instance=instance).update(released_at=now)
    if instance.is_slice:
        released += live_gpu_slices().filter(instance=instance).update(released_at=now)
    return released


def allocation_release_all(*, instance: Instance) -> None:
    now = timezone.now()
    gpu_allocation_release(instance=instance)
    PortAllocation.objects.filter(instance=instance, released_at=None).update(released_at=now)


def gpu_allocation_reclaim(*, instance: Instance) -> list[Gpu]:
    """Take back the GPUs a stopped instance had (its container is pinned to them).

    Raises NoCapacity when another rental holds one of them now. Locks the machine row.
    """
    machine = Machine.objects.select_for_update().get(pk=instance.machine_id)
    if instance.is_slice:
        if not machine.sharing_enabled:  # its card may be rented whole now
            raise NoCapacity("This machine no longer shares its GPUs; rent again elsewhere.")
        return [_slice_reclaim(instance)]
    last = (
        GpuAllocation.objects.filter(instance=instance)
        .exclude(released_at=None)
        .order_by("-released_at")
        .first()
    )
    if last is None:
        raise NoCapacity("This instance holds no GPUs to take back.")
    gpu_ids = list(
        GpuAllocation.objects.filter(instance=instance, released_at=last.released_at).values_list(
            "gpu_id", flat=True
        )
    )
    if live_gpu_allocations().filter(gpu_id__in=gpu_ids).exists():
        raise NoCapacity("Its GPUs are rented by someone else now; try again later.")
    gpus = list(Gpu.objects.filter(pk__in=gpu_ids, present=True).order_by("index"))
    if len(gpus) != len(gpu_ids):
        raise NoCapacity("One of its GPUs is missing from the machine.")
    try:
        with transaction.atomic():
            GpuAllocation.objects.bulk_create(
                [GpuAllocation(instance=instance, gpu=gpu) for gpu in gpus]
            )
    except IntegrityError as error:
        raise NoCapacity("Its GPUs were taken a moment ago.") from error
    return gpus


def _slice_reclaim(instance: Instance) -> Gpu:
    """Take back a stopped slice's share of its card (its container is pinned to it): the
    card's triggers refuse it when whole renters or other slices have taken what it needs."""
    last = GpuSlice.objects.filter(instance=instance).order_by("-released_at").first()
    if last is None:
        raise NoCapacity("This instance holds no GPU slice to take back.")
    gpu = Gpu.objects.filter(pk=last.gpu_id, present=True).first()
    if gpu is None:
        raise NoCapacity("Its GPU is missing from the machine.")
    try:
        with transaction.atomic():
            GpuSlice.objects.create(
                instance=instance,
                gpu=gpu,
                core_percent=last.core_percent,
                memory_mb=last.memory_mb,
            )
    except IntegrityError as error:
        raise NoCapacity(
            "Its card is taken by a whole-GPU rental or other slices now; try again later."
        ) from error
    return gpu


# Where ``with_live_holdings`` leaves an instance's live GPU allocations, slices and ports.
_LIVE_GPUS, _LIVE_SLICES, LIVE_PORTS = "live_gpu_rows", "live_slice_rows", "live_port_rows"


def with_live_holdings(instances: QuerySet[Instance]) -> QuerySet[Instance]:
    """``instances`` with what each holds now (GPUs with their uuids, slices, host ports) read
    in three statements for the whole page, not two per instance: ``instance_gpu_uuids`` and
    ``marketplace.selectors.published_ports`` use them when present."""
    return instances.prefetch_related(
        Prefetch(
            "gpu_allocations",
            live_gpu_allocations().select_related("gpu").order_by("gpu__index"),
            to_attr=_LIVE_GPUS,
        ),
        Prefetch("gpu_slices", live_gpu_slices().select_related("gpu"), to_attr=_LIVE_SLICES),
        Prefetch(
            "port_allocations",
            PortAllocation.objects.filter(released_at=None).order_by("container_port"),
            to_attr=LIVE_PORTS,
        ),
    )


def instance_gpu_uuids(instance: Instance) -> list[str]:
    """The uuids of the GPUs (a slice's: its card's) the instance holds now, in index order."""
    prefetched = getattr(instance, _LIVE_SLICES if instance.is_slice else _LIVE_GPUS, None)
    if prefetched is not None:
        return [held.gpu.uuid for held in prefetched]
    if instance.is_slice:
        return list(live_gpu_slices().filter(instance=instance).values_list("gpu__uuid", flat=True))
    return list(
        live_gpu_allocations()
        .filter(instance=instance)
        .order_by("gpu__index")
        .values_list("gpu__uuid", flat=True)
    )
