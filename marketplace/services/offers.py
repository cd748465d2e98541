"""The offers read model: one row per machine, recomputed from the machine and its live
allocations whenever either changes, so offer search reads one table."""

from __future__ import annotations

import re

from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone

from billing.money import MICRO_PER_DOLLAR
from hosts.models import Machine, MachineStatus
from marketplace.models import Offer
from scheduler.services import live_gpu_allocations


def short_gpu_name(name: str) -> str:
    """ "NVIDIA GeForce RTX 4090" → "RTX 4090", the way renters search for it."""
    return re.sub(r"^(NVIDIA\s+)?(GeForce\s+)?", "", name.strip()) or name


def offer_score(*, reliability: float, gpu_total_ram_gb: float, dph_total: int) -> float:
    """Value for money, weighted by reliability: GB of GPU memory per dollar-hour × r²."""
    dollars = max(dph_total / MICRO_PER_DOLLAR, 0.01)
    return round(reliability**2 * gpu_total_ram_gb / dollars, 4)


def offer_refresh(*, machine_id: int) -> Offer | None:
    """Recompute one machine's offer from the machine and its live allocations."""
    machine = (
        Machine.objects.filter(pk=machine_id)
        .annotate(
            present=Count("gpus", filter=Q(gpus__present=True), distinct=True),
        )
        .first()
    )
    if machine is None:
        return None
    taken = live_gpu_allocations().filter(gpu=OuterRef("pk"))
    free = machine.gpus.filter(present=True).exclude(Exists(taken)).count()
    first_gpu = machine.gpus.filter(present=True).order_by("index").first()
    total = machine.present or 0
    now = timezone.now()
    rentable = bool(
        machine.listed
        and machine.status == MachineStatus.ONLINE
        and first_gpu is not None
        and free >= max(machine.min_gpus, 1)
        and (machine.end_date is None or machine.end_date > now)
    )
    gpu_ram = (first_gpu.memory_mib / 1024) if first_gpu else 0.0
    dph_total = machine.price_per_gpu_hour * free
    values = {
        "provider_team_id": machine.team_id,
        "rentable": rentable,
        "gpu_name": short_gpu_name(first_gpu.name) if first_gpu else "",
        "num_gpus": free,
        "total_gpus": total,
        "min_gpus": machine.min_gpus,
        "gpu_ram": round(gpu_ram, 2),
        "cpu_cores_per_unit": machine.unit_cpus if total else 0,
        "cpu_ram_per_unit": round(machine.unit_memory_mb / 1024, 2) if total else 0,
        "disk_per_unit": float(machine.unit_disk_gb) if total else 0,
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
    offer, _ = Offer.objects.update_or_create(machine_id=machine.pk, defaults=values)
    return offer


def offers_refresh_all() -> int:
    count = 0
    for machine_id in Machine.objects.values_list("pk", flat=True).iterator():
        offer_refresh(machine_id=machine_id)
        count += 1
    return count


def _float(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0
