"""The offers read model: each machine's GPU-count bundles (``bundle_sizes``), recomputed from
the machine and its live allocations whenever either changes, so offer search reads one
table."""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime

from django.db import connection, models
from django.db.models import Q
from django.utils import timezone

from billing.money import MICRO_PER_DOLLAR
from core.pg_bulk import bigint_array, upsert_models
from hosts.models import Gpu, Machine, MachineStatus, MaintenanceWindow
from marketplace.models import Offer, Rental
from marketplace.rentals.bids import min_bid
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


def bundle_sizes(*, total: int, free: int, min_gpus: int) -> list[int]:
    """The GPU counts a machine is offered in, as vast.ai bundles them: 1, 2, 4, 8… up to its
    GPUs, from the provider's minimum (itself a size), its whole count, and the count free now
    (the ``all_free`` bundle, even 0 or below the minimum, which is then not rentable).

    Sizes depend on the machine, not on what is free, so a bundle keeps its id while rentals
    come and go: one that does not fit now stays, not rentable, and renting it answers 409."""
    least = max(min_gpus, 1)
    sizes = {free}
    if least <= total:
        sizes |= {least, total}
        size = 1
        while size <= total:
            if size >= least:
                sizes.add(size)
            size *= 2
    return sorted(sizes)


def offer_refresh(*, machine_id: int) -> Offer | None:
    """Recompute one machine's offers; returns its ``all_free`` one (all its free GPUs)."""
    offers = offers_refresh([machine_id])
    return next((offer for offer in offers if offer.all_free), None)


def offers_refresh(
    machine_ids: Iterable[int], *, machines: list[Machine] | None = None
) -> list[Offer]:
    """Recompute the offers of many machines in a few statements, whatever their number (a
    batch of placements touches hundreds): the machines (``machines`` when the caller has
    them, read in this transaction), their present GPUs, which of those are taken and their
    next maintenance, then one delete of bundles no longer offered and one upsert."""
    ids = sorted(set(machine_ids))
    if not ids:
        return []
    if machines is None:
        machines = list(Machine.objects.filter(pk__in=ids))
    now = timezone.now()
    gpus: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    taken: set[int] = set()
    maintenance: dict[int, datetime | None] = {}
    # GPUs an interruptible rental holds are still offered: an on-demand rental takes them,
    # and a bid above theirs does (``min_bid``).
    bids: dict[int, dict[int, int]] = defaultdict(dict)  # machine → GPU → the bid holding it
    for machine_id, index, pk, name, memory_mib, is_taken, bid, window in _present_gpus(ids, now):
        gpus[machine_id].append((index, pk, name, memory_mib))
        maintenance[machine_id] = _moment(window)
        if bid is not None:
            bids[machine_id][pk] = bid
        elif is_taken:
            taken.add(pk)
    cards = machine_cards(machines)  # sharing machines only: no query when none shares
    taken.update(card.gpu_id for each in cards.values() for card in each if not card.whole_free)
    offers = []
    kept: list[tuple[int, int]] = []  # (machine, GPUs) of each bundle offered now
    for machine in machines:
        present = sorted(gpus[machine.pk])
        machine.present_gpu_count = len(present)  # the unit sizes divide by it: no query each
        free = sum(1 for _, pk, _, _ in present if pk not in taken)
        values = _offer_values(machine, present, now, maintenance.get(machine.pk))
        values["min_bid"] = min_bid(machine, list(bids[machine.pk].values()))
        slices = _slice_values(machine, present, cards.get(machine.pk, []), values)
        sizes = bundle_sizes(total=len(present), free=free, min_gpus=machine.min_gpus)
        gpu_gb = present[0][3] / 1024 if present else 0.0
        for size in sizes:
            offers.append(_bundle(machine, values, slices, size=size, free=free, gpu_gb=gpu_gb))
        kept.extend((machine.pk, size) for size in sizes)
    _bundles_drop_others(ids, kept)
    return upsert_models(
        Offer, offers, unique_fields=["machine", "num_gpus"], update_fields=list(OFFER_FIELDS)
    )


def _bundles_drop_others(machine_ids: list[int], kept: list[tuple[int, int]]) -> None:
    """Delete the machines' bundles that are no longer offered (a size no longer free). On
    PostgreSQL in one statement over arrays: the ORM's OR of a condition per machine took
    longer to build than to run, for the hundreds of machines a batch of placements touches."""
    if connection.vendor != "postgresql":
        others = Q()
        for machine_id, size in kept:
            others |= Q(machine_id=machine_id, num_gpus=size)
        Offer.objects.filter(machine_id__in=machine_ids).exclude(others).delete()
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM marketplace_offer WHERE machine_id = ANY(%s::bigint[])"
            " AND (machine_id, num_gpus) NOT IN"
            " (SELECT * FROM unnest(%s::bigint[], %s::int[]))",
            [
                bigint_array(machine_ids),
                bigint_array(machine_id for machine_id, _ in kept),
                bigint_array(size for _, size in kept),
            ],
        )


def _bundle(
    machine: Machine, values: dict, slices: dict, *, size: int, free: int, gpu_gb: float
) -> Offer:
    """One bundle of the machine's offers: ``size`` GPUs, priced and sized for them (``gpu_gb``
    is one GPU's memory). The bundle of all free GPUs carries the machine's slices (a slice
    is not a bundle)."""
    all_free = size == free
    bundle = {
        **values,
        **(slices if all_free else NO_SLICES),
        "num_gpus": size,
        "dph_total": machine.price_per_gpu_hour * size,
        "score": offer_score(
            reliability=machine.reliability,
            gpu_total_ram_gb=gpu_gb * size,
            dph_total=machine.price_per_gpu_hour * size,
        ),
    }
    whole = values["rentable"] and max(machine.min_gpus, 1) <= size <= free
    bundle["rentable"] = whole or (all_free and slices["rentable"])
    bundle.update(benchmark_values(machine, num_gpus=size, dph_total=bundle["dph_total"]))
    return Offer(machine_id=machine.pk, all_free=all_free, rented=size > free, **bundle)


def _moment(value) -> datetime | None:
    """A timestamp read by raw SQL: SQLite gives text, in UTC."""
    if value is None or isinstance(value, datetime):
        return value
    parsed = models.DateTimeField().to_python(value)
    return timezone.make_aware(parsed, UTC) if timezone.is_naive(parsed) else parsed


def _present_gpus(machine_ids: list[int], now: datetime) -> list[tuple]:
    """The machines' present GPUs, whether each is rented whole and at which bid if
    interruptibly, and when their machine's next maintenance window (one not over at ``now``)
    starts, in one statement: (machine id, index, pk, name, memory MiB, taken, bid, window).

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
        states = sorted(state.value for state in INTERRUPTIBLE_STATES)
        cursor.execute(sql, [*states, now, *machine_ids])
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
         LIMIT 1) AS bid,
       (SELECT MIN(w.starts_at) FROM {MaintenanceWindow._meta.db_table} w
         WHERE w.machine_id = g.machine_id AND w.ends_at > %s) AS maintenance
  FROM {Gpu._meta.db_table} g
 WHERE g.machine_id IN ({{machines}}) AND g.present
"""  # noqa: S608  (table names from the models; values are parameters)


OFFER_FIELDS = (
    "provider_team_id", "rentable", "gpu_name", "num_gpus", "total_gpus", "min_gpus", "gpu_ram",
    "cpu_cores_per_unit", "cpu_ram_per_unit", "disk_per_unit", "disk_enforced",
    "price_per_gpu_hour", "dph_total", "storage_cost", "reliability", "end_date", "geolocation",
    "driver_version", "cuda_max_good", "verified", "score", "sharing", "gpu_frac",
    "slice_core_percent", "slice_memory_mb", "min_slice_core_percent", "cards", "min_bid",
    "all_free", "rented", "cpu_cores", "datacenter", "static_ip", "direct_port_count",
    *BENCHMARK_FIELDS,
)  # fmt: skip

NO_SLICES = {"sharing": False, "gpu_frac": 0.0, "slice_core_percent": 0, "slice_memory_mb": 0,
             "min_slice_core_percent": 0, "cards": []}  # fmt: skip


def _slice_values(machine: Machine, present: list, cards: list[Card], shared: dict) -> dict:
    """The ``all_free`` bundle's slice columns: on a sharing machine, what one slice can take
    now and each shareable card's free share (cards rented whole are not listed); and
    ``rentable``: whether a slice can be rented now (so that bundle is rentable even when no
    whole GPU is free). ``shared`` is the machine's columns (``_offer_values``)."""
    if not machine.sharing_enabled:
        return {**NO_SLICES, "rentable": False}
    index = {pk: gpu_index for gpu_index, pk, _, _ in present}
    usable = [c for c in cards if c.free_core >= machine.sharing_min_core_percent]
    frac = max(
        (min(c.free_core / 100, c.free_memory_mb / max(c.memory_mb, 1)) for c in usable),
        default=0.0,
    )
    return {
        "sharing": True,
        "rentable": shared["rentable"] and bool(usable),
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


def _offer_values(
    machine: Machine, present: list, now: datetime, maintenance: datetime | None
) -> dict:
    """The columns a machine's bundles share: ``present`` is its present GPUs as (index, pk,
    name, memory MiB) in index order, ``maintenance`` when its next maintenance window starts.
    ``rentable`` here says the machine is open for rentals now (listed, online, with GPUs,
    before the offer's end); each bundle adds whether its GPUs are free (``_bundle``)."""
    first_gpu = present[0] if present else None
    total = len(present)
    end_date = min((d for d in (machine.end_date, maintenance) if d is not None), default=None)
    gpu_ram = (first_gpu[3] / 1024) if first_gpu else 0.0
    return {
        "provider_team_id": machine.team_id,
        "rentable": bool(
            machine.listed
            and machine.status == MachineStatus.ONLINE
            and first_gpu is not None
            and (end_date is None or end_date > now)
        ),
        "gpu_name": short_gpu_name(first_gpu[2]) if first_gpu else "",
        "total_gpus": total,
        "min_gpus": machine.min_gpus,
        "gpu_ram": round(gpu_ram, 2),
        "cpu_cores_per_unit": machine.unit_cpus if total else 0,
        "cpu_ram_per_unit": round(machine.unit_memory_mb / 1024, 2) if total else 0,
        "disk_per_unit": float(machine.unit_disk_gb) if total else 0,
        "disk_enforced": machine.disk_enforced,
        "price_per_gpu_hour": machine.price_per_gpu_hour,
        "storage_cost": machine.storage_price_per_gb_month,
        "reliability": machine.reliability,
        "end_date": end_date,
        "geolocation": machine.location,
        "driver_version": machine.driver_version or "",
        "cuda_max_good": _float(machine.cuda_version),
        "verified": machine.verified,
        "cpu_cores": machine.cpu_cores,
        "datacenter": False,
        "static_ip": _is_ip_address(machine.address),
        "direct_port_count": machine.port_range_end - machine.port_range_start + 1,
    }


def _is_ip_address(address: str) -> bool:
    """Whether the machine is reached at an IP address (rentals' ports are published on it),
    not at a host name whose address may change."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


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
