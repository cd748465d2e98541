"""Reads for the provider dashboard: occupancy, heartbeat history."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.db.models import Count, Q
from django.db.models.functions import TruncHour
from django.utils import timezone

from hosts.models import Gpu, HeartbeatSample, Machine

# Higher rooms register how to tell which GPUs are rented (hosts does not import them):
# fn(machine_ids) -> {gpu_id: "rented"}.
_occupancy_sources: list[Callable[[list[int]], dict[int, str]]] = []


def register_occupancy(source: Callable[[list[int]], dict[int, str]]) -> None:
    if source not in _occupancy_sources:
        _occupancy_sources.append(source)


def gpu_occupancy(machines: list[Machine]) -> dict[int, list[tuple[Gpu, str]]]:
    """Per machine: each GPU with "free", "rented" or "offline"."""
    ids = [m.pk for m in machines]
    rented: dict[int, str] = {}
    for source in _occupancy_sources:
        rented.update(source(ids))
    online = {m.pk: m.status == "online" for m in machines}
    grid: dict[int, list[tuple[Gpu, str]]] = {m.pk: [] for m in machines}
    for gpu in Gpu.objects.filter(machine_id__in=ids).order_by("machine_id", "index"):
        if not gpu.present or not online[gpu.machine_id]:
            state = "offline"
        else:
            state = rented.get(gpu.pk, "free")
        grid[gpu.machine_id].append((gpu, state))
    return grid


def heartbeat_series(machine: Machine, hours: int = 24) -> list[tuple[str, float, int]]:
    """(hour label, share answered, samples) per hour over the last ``hours``."""
    since = timezone.now() - timedelta(hours=hours)
    rows = (
        HeartbeatSample.objects.filter(machine=machine, created_at__gte=since)
        .annotate(hour=TruncHour("created_at"))
        .values("hour")
        .annotate(total=Count("pk"), ok=Count("pk", filter=Q(ok=True)))
        .order_by("hour")
    )
    return [(row["hour"].strftime("%H:00"), row["ok"] / row["total"], row["total"]) for row in rows]
