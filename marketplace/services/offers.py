"""The offers read model: one row per machine, recomputed from the machine and its live
allocations whenever either changes, so offer search reads one table."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from django.db import connection
from django.utils import timezone

from billing.money import MICRO_PER_DOLLAR
from hosts.models import Gpu, Machine, MachineStatus
from marketplace.models import Offer, Rental
from marketplace.services.bids import min_bid
from marketplace.services.offer_figures import BENCHMARK_FIELDS, benchmark_values
from scheduler.models import GpuAllocation, Instance
from scheduler.placement import Card
from scheduler.services import INTERRUPTIBLE_STATES, machine_cards


def short_gpu_name(name: str) -> str:
    """ "NVIDIA GeForce RTX 4090" → "RTX 4090", the way renters search for it."""
    return re.sub(r"^(NVIDIA\s+)?(GeForce\s+)?", "", name.strip()) or name


def offer_score(*, reliability: float, gpu_total_ram_gb: float, dph_total: int) -> float:
    """Value for money, weighted by reliability: GB of GPU memory per dollar-hour × r²."""
    dollars = max(dph_total / MICRO_PER_DOLLAR, 0.01)
    return round(reliability**2 * gpu_total_ram_gb / dollars, 4)


def offer_refresh(*, machine_id: int) -> Offer | None:
    """Recompute one machine's offer from the machine and its live allocations."""
    offers = offers_refresh([machine_id])
    return offers[0] if offers else None


def offers_refresh(
    machine_ids: Iterable[int], *, machines: list[Machine] | None = None
) -> list[Offer]:
    """Recompute the offers of many machines in a few statements, whatever their number (a
    batch of placements touches hundreds): the machines (``machines`` when the caller has
    them, read in this transaction), their present GPUs and which of those are taken, then
    one upsert."""
    ids = sorted(set(machine_ids))
    if not ids:
        return []
    if machines is None:
        machines = list(Machine.objects.filter(pk__in=ids))
    gpus: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    taken: set[int] = set()
    # GPUs an interruptible rental holds are still offered: an on-demand rental takes them,
    # and a bid above theirs does (``min_bid``).
    bids: dict[int, dict[int, int]] = defaultdict(dict)  # machine → GPU → the bid holding it
    for machine_id, index, pk, name, memory_mib, is_taken, bid in _present_gpus(ids):
        gpus[machine_id].append((index, pk, name, memory_mib))
        if bid is not None:
            bids[machine_id][pk] = bid
        elif is_taken:
            taken.add(pk)
    cards = machine_cards(machines)  # sharing machines only: no query when none shares
    taken.update(card.gpu_id for each in cards.values() for card in each if not card.whole_free)
    now = timezone.now()
    offers = []
    for machine in machines:
        present = sorted(gpus[machine.pk])
        machine.present_gpu_count = len(present)  # the unit sizes divide by it: no query each
        free = sum(1 for _, pk, _, _ in present if pk not in taken)
        values = _offer_values(machine, present, free, now)
        values["min_bid"] = min_bid(machine, list(bids[machine.pk].values()))
        values.update(_slice_values(machine, present, cards.get(machine.pk, []), values))
        values.update(
            benchmark_values(machine, num_gpus=values["num_gpus"], dph_total=values["dph_total"])
        )
        offers.append(Offer(machine_id=machine.pk, **values))
    return Offer.objects.bulk_create(
        offers,
        update_conflicts=True,
        unique_fields=["machine"],
        update_fields=list(OFFER_FIELDS),
    )


def _present_gpus(machine_ids: list[int]) -> list[tuple]:
    """The machines' present GPUs, whether each is rented whole and at which bid if
    interruptibly, in one statement: (machine id, index, pk, name, memory MiB, taken, bid).

    Written out rather than built by the ORM: building it (an EXISTS and a subquery through
    the instance to its rental) cost many times the CPU that running it takes, and a rent
    refreshes its machine's offer on its way to the answer (figures in docs/benchmarks.md).
    Valid on PostgreSQL and SQLite alike."""
    if not machine_ids:
        return []
    sql = _PRESENT_GPUS_SQL.format(
        machines=", ".join(["%s"] * len(machine_ids)),
        states=", ".join(["%s"] * len(INTERRUPTIBLE_STATES)),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*sorted(state.value for state in INTERRUPTIBLE_STATES), *machine_ids])
        return cursor.fetchall()


# ``live_gpu_allocations`` (released_at IS NULL), and for ``bid`` those of an interruptible
# rental in INTERRUPTIBLE_STATES, as offers were refreshed with through the ORM.
_PRESENT_GPUS_SQL = f"""
SELECT g.machine_id, g."index", g.id, g.name, g.memory_mib,
       EXISTS (SELECT 1 FROM {GpuAllocation._meta.db_table} a
               WHERE a.gpu_id = g.id AND a.released_at IS NULL) AS taken,
       (SELECT r.price_per_gpu_hour
          FROM {GpuAllocation._meta.db_table} a
          JOIN {Instance._meta.db_table} i ON i.id = a.instance_id
          JOIN {Rental._meta.db_table} r ON r.instance_id = i.id
         WHERE a.gpu_id = g.id AND a.released_at IS NULL AND r.interruptible
           AND i.state IN ({{states}})
         LIMIT 1) AS bid
  FROM {Gpu._meta.db_table} g
 WHERE g.machine_id IN ({{machines}}) AND g.present
"""  # noqa: S608  (table names from the models; values are parameters)


OFFER_FIELDS = (
    "provider_team_id", "rentable", "gpu_name", "num_gpus", "total_gpus", "min_gpus", "gpu_ram",
    "cpu_cores_per_unit", "cpu_ram_per_unit", "disk_per_unit", "disk_enforced",
    "price_per_gpu_hour", "dph_total", "storage_cost", "reliability", "end_date", "geolocation",
    "driver_version", "cuda_max_good", "verified", "score", "sharing", "gpu_frac",
    "slice_core_percent", "slice_memory_mb", "min_slice_core_percent", "cards", "min_bid",
    *BENCHMARK_FIELDS,
)  # fmt: skip


def _slice_values(machine: Machine, present: list, cards: list[Card], whole: dict) -> dict:
    """The offer's slice columns: on a sharing machine, what one slice can take now and each
    shareable card's free share (cards rented whole are not listed). A machine with slices
    free is rentable even when no whole GPU is."""
    if not machine.sharing_enabled:
        return {"sharing": False, "gpu_frac": 0.0, "slice_core_percent": 0,
                "slice_memory_mb": 0, "min_slice_core_percent": 0, "cards": []}  # fmt: skip
    index = {pk: gpu_index for gpu_index, pk, _, _ in present}
    usable = [c for c in cards if c.free_core >= machine.sharing_min_core_percent]
    frac = max(
        (min(c.free_core / 100, c.free_memory_mb / max(c.memory_mb, 1)) for c in usable),
        default=0.0,
    )
    open_for_rent = bool(
        machine.listed
        and machine.status == MachineStatus.ONLINE
        and (machine.end_date is None or machine.end_date > timezone.now())
    )
    return {
        "sharing": True,
        "rentable": whole["rentable"] or (open_for_rent and bool(usable)),
        "gpu_frac": round(frac, 4),
        "slice_core_percent": max((c.free_core for c in usable), default=0),
        "slice_memory_mb": max((c.free_memory_mb for c in usable), default=0),
        "min_slice_core_percent": machine.sharing_min_core_percent,
        "cards": [
            {
                "gpu_index": index.get(c.gpu_id),
                "free_core_percent": c.free_core,
                "free_memory_mb": c.free_memory_mb,
                "memory_mb": c.memory_mb,
            }
            for c in sorted(cards, key=lambda c: index.get(c.gpu_id, 0))
        ],
    }


def _offer_values(machine: Machine, present: list, free: int, now) -> dict:
    """An offer's columns: ``present`` is the machine's present GPUs as (index, pk, name,
    memory MiB) in index order, ``free`` how many of them are free or held by interruptible
    rentals (which an on-demand rental takes)."""
    first_gpu = present[0] if present else None
    total = len(present)
    rentable = bool(
        machine.listed
        and machine.status == MachineStatus.ONLINE
        and first_gpu is not None
        and free >= max(machine.min_gpus, 1)
        and (machine.end_date is None or machine.end_date > now)
    )
    gpu_ram = (first_gpu[3] / 1024) if first_gpu else 0.0
    dph_total = machine.price_per_gpu_hour * free
    return {
        "provider_team_id": machine.team_id,
        "rentable": rentable,
        "gpu_name": short_gpu_name(first_gpu[2]) if first_gpu else "",
        "num_gpus": free,
        "total_gpus": total,
        "min_gpus": machine.min_gpus,
        "gpu_ram": round(gpu_ram, 2),
        "cpu_cores_per_unit": machine.unit_cpus if total else 0,
        "cpu_ram_per_unit": round(machine.unit_memory_mb / 1024, 2) if total else 0,
        "disk_per_unit": float(machine.unit_disk_gb) if total else 0,
        "disk_enforced": machine.disk_enforced,
        "price_per_gpu_hour": machine.price_per_gpu_hour,
        "dph_total": dph_total,
        "storage_cost": machine.storage_price_per_gb_month,
        "reliability": machine.reliability,
        "end_date": machine.end_date,
        "geolocation": machine.location,
        "driver_version": machine.driver_version or "",
        "cuda_max_good": _float(machine.cuda_version),
        "verified": machine.verified,
        "score": offer_score(
            reliability=machine.reliability,
            gpu_total_ram_gb=gpu_ram * free,
            dph_total=dph_total,
        ),
    }


def offers_refresh_all() -> int:
    ids = list(Machine.objects.order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(ids), 1000):
        offers_refresh(ids[start : start + 1000])
    return len(ids)


def _float(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0
