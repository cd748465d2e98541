"""Reads of the hosts room: occupancy, maintenance, heartbeat and utilization history."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Avg, Count, Max, Q
from django.db.models.functions import TruncHour
from django.utils import timezone

from hosts.models import (
    BenchmarkRun,
    Gpu,
    HeartbeatSample,
    Machine,
    MachineStatus,
    MaintenanceWindow,
    ReliabilityRecord,
)

# Higher rooms register how to tell which GPUs are rented (hosts does not import them):
# fn(machine_ids) -> {gpu_id: "rented"}.
_occupancy_sources: list[Callable[[list[int]], dict[int, str]]] = []


def register_occupancy(source: Callable[[list[int]], dict[int, str]]) -> None:
    """Add a source of GPU occupancy: ``source(machine_ids) -> {gpu_id: "rented"}``."""
    if source not in _occupancy_sources:
        _occupancy_sources.append(source)


def rented_gpu_ids(machine_ids: list[int]) -> dict[int, str]:
    """GPU id → state ("rented") per the registered sources; empty when none is registered."""
    rented: dict[int, str] = {}
    for source in _occupancy_sources:
        rented.update(source(machine_ids))
    return rented


GPU_STATES = ("free", "rented", "offline", "missing")


def gpu_occupancy(machines: list[Machine]) -> dict[int, list[tuple[Gpu, str]]]:
    """Per machine: each GPU with "free", "rented", "offline" or "missing".

    A GPU that disappeared from nvidia-smi is "missing"; any other GPU of a machine that is
    not online is "offline", except that a rented GPU of an offline machine stays "rented" so
    the provider sees which rentals the outage hits.
    """
    ids = [m.pk for m in machines]
    rented = rented_gpu_ids(ids)
    online = {m.pk: m.status == MachineStatus.ONLINE for m in machines}
    grid: dict[int, list[tuple[Gpu, str]]] = {m.pk: [] for m in machines}
    for gpu in Gpu.objects.filter(machine_id__in=ids).order_by("machine_id", "index"):
        if not gpu.present:
            state = "missing"
        elif gpu.pk in rented:
            state = rented[gpu.pk]
        else:
            state = "free" if online[gpu.machine_id] else "offline"
        grid[gpu.machine_id].append((gpu, state))
    return grid


def maintenance_overlapping(
    machine_id: int, starts_at: datetime, ends_at: datetime
) -> MaintenanceWindow | None:
    """The first maintenance window of the machine that overlaps [starts_at, ends_at), if any.

    The scheduler calls this before placing a rental: no new rental may overlap a window.
    """
    return (
        MaintenanceWindow.objects.filter(
            machine_id=machine_id, starts_at__lt=ends_at, ends_at__gt=starts_at
        )
        .order_by("starts_at")
        .first()
    )


def next_maintenance(machine_id: int, after: datetime | None = None) -> MaintenanceWindow | None:
    """The next window that has not ended yet (a rental may run until it starts)."""
    return (
        MaintenanceWindow.objects.filter(machine_id=machine_id, ends_at__gt=after or timezone.now())
        .order_by("starts_at")
        .first()
    )


@dataclass(frozen=True)
class HourPoint:
    hour: datetime
    label: str
    answered: float  # share of heartbeats answered, 0..1
    samples: int
    utilization: float  # rented GPUs ÷ present GPUs, averaged over the hour's samples
    gpus: int  # present GPUs at the hour's last sample


def hourly_history(machine: Machine, hours: int = 24) -> list[HourPoint]:
    """Per hour over the last ``hours``: share of heartbeats answered and GPU utilization."""
    since = timezone.now() - timedelta(hours=hours)
    rows = (
        HeartbeatSample.objects.filter(machine=machine, created_at__gte=since)
        .annotate(hour=TruncHour("created_at"))
        .values("hour")
        .annotate(
            total=Count("pk"),
            ok=Count("pk", filter=Q(ok=True)),
            rented=Avg("gpus_rented"),
            gpus=Max("gpus_total"),
        )
        .order_by("hour")
    )
    return [
        HourPoint(
            hour=row["hour"],
            label=row["hour"].strftime("%H:00"),
            answered=row["ok"] / row["total"],
            samples=row["total"],
            utilization=(row["rented"] or 0) / row["gpus"] if row["gpus"] else 0.0,
            gpus=row["gpus"] or 0,
        )
        for row in rows
    ]


def heartbeat_series(machine: Machine, hours: int = 24) -> list[tuple[str, float, int]]:
    """(hour label, share answered, samples) per hour over the last ``hours``."""
    return [(p.label, p.answered, p.samples) for p in hourly_history(machine, hours)]


def benchmark_history(machine: Machine, *, limit: int = 30) -> list[BenchmarkRun]:
    """The machine's last ``limit`` benchmark runs, oldest first (for its chart)."""
    runs = list(
        BenchmarkRun.objects.filter(machine=machine).order_by("-measured_at", "-pk")[:limit]
    )
    return runs[::-1]


def reliability_history(machine: Machine, *, limit: int = 48) -> list[ReliabilityRecord]:
    """The machine's last ``limit`` reliability records, oldest first."""
    records = list(
        ReliabilityRecord.objects.filter(machine=machine).order_by("-recorded_at")[:limit]
    )
    return records[::-1]
