"""Writes of the hosts room: register a machine, pin its key, probe it, list it, watch it.

SSH happens outside transactions (a slow machine must not hold row locks); each write after
it is a short transaction that re-reads the row.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from hosts import ssh
from hosts.models import Gpu, HeartbeatSample, Machine, MachineEvent, MachineStatus
from hosts.probe import ProbeResult, probe
from hosts.signals import gpu_missing, machine_changed, machine_status_changed

logger = logging.getLogger(__name__)

MAX_PRICE_PER_GPU_HOUR = 1_000 * 1_000_000  # $1,000/GPU-hour: anything above is a typo
MAX_STORAGE_PRICE = 100 * 1_000_000  # $100/GB-month
RELIABILITY_WINDOW = timedelta(days=7)


def heartbeat_seconds() -> int:
    return int(getattr(settings, "HOST_HEARTBEAT_SECONDS", 30))


def heartbeat_misses_allowed() -> int:
    return int(getattr(settings, "HOST_HEARTBEAT_MISSES", 3))


def _event(machine: Machine, kind: str, message: str) -> None:
    MachineEvent.objects.create(machine=machine, kind=kind, message=message[:500])


def _set_status(machine: Machine, new: str, reason: str) -> None:
    """Change status and record why; signal on commit. Call inside a transaction."""
    old = machine.status
    if old == new:
        return
    machine.status = new
    machine.status_detail = reason[:500]
    machine.save(update_fields=["status", "status_detail"])
    _event(machine, "status", f"{old} → {new}: {reason}")
    payload = {
        "machine_id": machine.pk,
        "team_id": machine.team_id,
        "old": old,
        "new": new,
        "reason": reason,
    }
    transaction.on_commit(lambda: machine_status_changed.send_robust(sender=Machine, **payload))


def _changed(machine_id: int) -> None:
    transaction.on_commit(
        lambda: machine_changed.send_robust(sender=Machine, machine_id=machine_id)
    )


@transaction.atomic
def machine_register(*, team_id: int, name: str, address: str, port: int, ssh_user: str) -> Machine:
    errors = {}
    address = address.strip()
    if (
        not address
        or any(c.isspace() for c in address)
        or address.startswith("-")
        or len(address) > 255
    ):
        errors["address"] = "A host name or IP address, like gpu1.example.com or 203.0.113.7."
    if not (1 <= port <= 65535):
        errors["port"] = "An SSH port between 1 and 65535."
    if (
        not ssh_user
        or not ssh_user.replace("-", "").replace("_", "").replace(".", "").isalnum()
        or ssh_user.startswith("-")
    ):
        errors["ssh_user"] = "A user name: letters, digits, '-', '_', '.'."
    if not errors and Machine.objects.filter(address=address, port=port).exists():
        errors["address"] = "This address and port are already registered."
    if errors:
        raise ValidationError(errors)
    machine = Machine.objects.create(
        team_id=team_id, name=(name.strip() or address)[:80], address=address, port=port,
        ssh_user=ssh_user,
    )  # fmt: skip
    _event(machine, "registered", f"Registered {ssh_user}@{address}:{port}")
    return machine


def machine_fetch_host_key(*, machine_id: int) -> Machine:
    """Connect (without trusting) and remember the key the machine offers, for confirmation."""
    machine = Machine.objects.get(pk=machine_id)
    try:
        key = ssh.fetch_host_key(machine.address, machine.port)
    except ssh.HostUnreachable as error:
        with transaction.atomic():
            machine = Machine.objects.select_for_update().get(pk=machine_id)
            _set_status(machine, MachineStatus.ERROR, str(error))
        return machine
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        machine.offered_key_type, machine.offered_key = key.key_type, key.key_base64
        machine.offered_key_fingerprint = key.fingerprint
        machine.save(update_fields=["offered_key_type", "offered_key", "offered_key_fingerprint"])
        if not machine.host_key:
            _set_status(
                machine, MachineStatus.AWAITING_CONFIRMATION, f"Presented {key.fingerprint}"
            )
        elif machine.host_key != key.key_base64:
            _set_status(machine, MachineStatus.KEY_MISMATCH, f"Now presents {key.fingerprint}")
    return machine


@transaction.atomic
def machine_confirm_host_key(*, machine_id: int, fingerprint: str) -> Machine:
    """Pin the offered key, if the provider confirms the fingerprint they saw."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    if not machine.offered_key or machine.offered_key_fingerprint != fingerprint.strip():
        raise ValidationError({"fingerprint": "This is not the fingerprint the machine presented."})
    machine.host_key_type, machine.host_key = machine.offered_key_type, machine.offered_key
    machine.host_key_fingerprint = machine.offered_key_fingerprint
    machine.save(update_fields=["host_key_type", "host_key", "host_key_fingerprint"])
    _event(machine, "key_pinned", f"Host key {fingerprint} confirmed and pinned")
    _set_status(machine, MachineStatus.PENDING, "Host key pinned; probing")
    return machine


def machine_probe(*, machine_id: int) -> Machine:
    """Probe over SSH and store the figures; flag GPUs that disappeared."""
    machine = Machine.objects.get(pk=machine_id)
    try:
        result = probe(machine)
    except ssh.HostKeyMismatch as error:
        with transaction.atomic():
            _set_status(
                Machine.objects.select_for_update().get(pk=machine_id),
                MachineStatus.KEY_MISMATCH,
                str(error),
            )
        raise
    except (ssh.HostUnreachable, ssh.CommandFailed, ValueError) as error:
        with transaction.atomic():
            _set_status(
                Machine.objects.select_for_update().get(pk=machine_id),
                MachineStatus.ERROR,
                f"Probe failed: {error}",
            )
        raise
    return machine_apply_probe(machine_id=machine_id, result=result)


@transaction.atomic
def machine_apply_probe(*, machine_id: int, result: ProbeResult) -> Machine:
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    for name in ("cuda_version", "cpu_cores", "ram_mb", "disk_free_gb", "docker_version",
                 "nvidia_runtime", "os_name"):  # fmt: skip
        setattr(machine, name, getattr(result, name))
    machine.driver_version = result.gpus[0].driver_version if result.gpus else ""
    machine.probed_at = timezone.now()
    machine.save()
    seen = set()
    for gpu in result.gpus:
        seen.add(gpu.uuid)
        Gpu.objects.update_or_create(
            machine=machine, uuid=gpu.uuid,
            defaults={"index": gpu.index, "name": gpu.name, "memory_mib": gpu.memory_mib, "present": True},
        )  # fmt: skip
    for missing in machine.gpus.filter(present=True).exclude(uuid__in=seen):
        missing.present = False
        missing.save(update_fields=["present"])
        _event(
            machine,
            "gpu_missing",
            f"GPU {missing.index} ({missing.uuid}) no longer reported by nvidia-smi",
        )
        transaction.on_commit(
            lambda uuid=missing.uuid: gpu_missing.send_robust(
                sender=Machine, machine_id=machine_id, gpu_uuid=uuid
            )
        )
    summary = f"{len(result.gpus)} GPU(s), {result.cpu_cores} cores, {result.ram_mb // 1024} GB RAM, {result.disk_free_gb} GB free"
    _event(
        machine, "probed", summary + ("; " + "; ".join(result.problems) if result.problems else "")
    )
    if result.problems:
        _set_status(machine, MachineStatus.ERROR, "; ".join(result.problems))
    elif machine.status in (MachineStatus.PENDING, MachineStatus.ERROR):
        _set_status(machine, MachineStatus.ONLINE, "Probe succeeded")
    machine.last_heartbeat_at = timezone.now()
    machine.save(update_fields=["last_heartbeat_at"])
    _changed(machine.pk)
    return machine


@transaction.atomic
def machine_set_terms(
    *,
    machine_id: int,
    price_per_gpu_hour: int,
    storage_price_per_gb_month: int,
    min_gpus: int,
    end_date: datetime | None,
    location: str,
    port_range_start: int | None = None,
    port_range_end: int | None = None,
) -> Machine:
    """Listing terms. They apply to new rentals; running rentals keep the price they got."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    errors = {}
    if not (0 <= price_per_gpu_hour <= MAX_PRICE_PER_GPU_HOUR):
        errors["price_per_gpu_hour"] = "Between $0 and $1,000 per GPU-hour."
    if not (0 <= storage_price_per_gb_month <= MAX_STORAGE_PRICE):
        errors["storage_price_per_gb_month"] = "Between $0 and $100 per GB-month."
    gpus = machine.gpu_count
    if not (1 <= min_gpus <= max(gpus, 1)):
        errors["min_gpus"] = f"Between 1 and the machine's {gpus} GPU(s)."
    if end_date is not None and end_date <= timezone.now():
        errors["end_date"] = "The end date must be in the future."
    location = location.strip()
    if len(location) > 64:
        errors["location"] = "At most 64 characters."
    start = port_range_start or machine.port_range_start
    end = port_range_end or machine.port_range_end
    if not (1024 <= start <= end <= 65535):
        errors["port_range_start"] = "A range of host ports within 1024-65535, start ≤ end."
    if errors:
        raise ValidationError(errors)
    machine.price_per_gpu_hour = price_per_gpu_hour
    machine.storage_price_per_gb_month = storage_price_per_gb_month
    machine.min_gpus, machine.end_date, machine.location = min_gpus, end_date, location
    machine.port_range_start, machine.port_range_end = start, end
    machine.save()
    _event(machine, "terms", "Listing terms updated")
    _changed(machine.pk)
    return machine


@transaction.atomic
def machine_set_listed(*, machine_id: int, listed: bool) -> Machine:
    """List or unlist; unlisting never touches running rentals, it only stops new ones."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    if listed and (machine.status != MachineStatus.ONLINE or machine.gpu_count == 0):
        raise ValidationError({"listed": "Only an online machine with GPUs can be listed."})
    if listed and machine.price_per_gpu_hour <= 0:
        raise ValidationError({"listed": "Set a price per GPU-hour first."})
    machine.listed = listed
    machine.save(update_fields=["listed"])
    _event(machine, "listing", "Listed" if listed else "Unlisted (running rentals continue)")
    _changed(machine.pk)
    return machine


def machine_heartbeat(*, machine_id: int) -> Machine:
    """One heartbeat over the pooled connection; K misses in a row → offline, a success → online."""
    machine = Machine.objects.get(pk=machine_id)
    started = time.monotonic()
    failure = None
    try:
        ssh.run(machine, ["true"], timeout=10)
    except ssh.HostKeyMismatch as error:
        failure = ("key", str(error))
    except (ssh.HostUnreachable, ssh.CommandFailed) as error:
        failure = ("miss", str(error))
        ssh.pool.forget(machine_id)
    latency = int((time.monotonic() - started) * 1000)
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        HeartbeatSample.objects.create(
            machine=machine, ok=failure is None, latency_ms=latency if not failure else None
        )
        now = timezone.now()
        if failure is None:
            machine.heartbeat_misses = 0
            machine.last_heartbeat_at = now
            if machine.status in (MachineStatus.OFFLINE, MachineStatus.KEY_MISMATCH):
                _set_status(machine, MachineStatus.ONLINE, "Heartbeats answered again")
        elif failure[0] == "key":
            _set_status(machine, MachineStatus.KEY_MISMATCH, failure[1])
        else:
            machine.heartbeat_misses += 1
            if (
                machine.heartbeat_misses >= heartbeat_misses_allowed()
                and machine.status == MachineStatus.ONLINE
            ):
                _set_status(
                    machine,
                    MachineStatus.OFFLINE,
                    f"{machine.heartbeat_misses} heartbeats missed: {failure[1]}",
                )
        machine.reliability = machine_reliability(machine)
        machine.save(update_fields=["heartbeat_misses", "last_heartbeat_at", "reliability"])
        _changed(machine.pk)
    return machine


def machine_reliability(machine: Machine, now: datetime | None = None) -> float:
    """Answered heartbeats ÷ heartbeats sent over the last 7 days (1.0 before any were sent)."""
    since = (now or timezone.now()) - RELIABILITY_WINDOW
    samples = HeartbeatSample.objects.filter(machine=machine, created_at__gte=since)
    total = samples.count()
    if total == 0:
        return 1.0
    return round(samples.filter(ok=True).count() / total, 4)
