"""Writes of the hosts room: register a machine, pin its key, probe it, list it, watch it.

SSH happens outside transactions (a slow machine must not hold row locks); each write after
it is a short transaction that re-reads the row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, ProtectedError, Q
from django.utils import timezone

from hosts import addresses, ssh
from hosts.models import (
    Gpu,
    HeartbeatSample,
    Machine,
    MachineEvent,
    MachineStatus,
    MaintenanceWindow,
)
from hosts.probe import ProbeResult, probe
from hosts.signals import (
    gpu_missing,
    machine_changed,
    machine_host_key_mismatch,
    machine_status_changed,
)

logger = logging.getLogger(__name__)

MAX_PRICE_PER_GPU_HOUR = 1_000 * 1_000_000  # $1,000/GPU-hour: anything above is a typo
MAX_STORAGE_PRICE = 100 * 1_000_000  # $100/GB-month
RELIABILITY_WINDOW = timedelta(days=7)
MAX_MAINTENANCE = timedelta(days=14)
MAINTENANCE_HORIZON = timedelta(days=365)

# Higher rooms register how to tell until when the machine is committed (its rentals' end
# dates): fn(machine_id) -> the latest such moment, or None. hosts imports none of them.
_commitment_sources: list[Callable[[int], datetime | None]] = []


def register_commitments(source: Callable[[int], datetime | None]) -> None:
    """Add a source of commitments: ``source(machine_id) -> latest end or None``."""
    if source not in _commitment_sources:
        _commitment_sources.append(source)


def committed_until(machine_id: int) -> datetime | None:
    """The latest end of what the machine is committed to (None when nothing is)."""
    ends = [end for source in _commitment_sources if (end := source(machine_id)) is not None]
    return max(ends, default=None)


def heartbeat_seconds() -> int:
    return int(getattr(settings, "HOST_HEARTBEAT_SECONDS", 30))


def heartbeat_misses_allowed() -> int:
    return int(getattr(settings, "HOST_HEARTBEAT_MISSES", 3))


def probe_failures_allowed() -> int:
    """Failed probes in a row (tools failing on a machine that answers) before it is taken
    out of service: one bad nvidia-smi must not stop every rental on the machine."""
    return int(getattr(settings, "HOST_PROBE_FAILURES", 3))


def probe_retry_seconds() -> int:
    """How soon a machine that answers heartbeats is probed again after a failed probe (or
    while it is in error or being set up), so it recovers without anyone pressing a button."""
    return int(getattr(settings, "HOST_PROBE_RETRY_SECONDS", 300))


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
    if new == MachineStatus.KEY_MISMATCH:
        # The pool refuses a flagged machine by its status too; this also closes a connection
        # opened before the key changed, in this process at once.
        transaction.on_commit(lambda: ssh.pool.forget(payload["machine_id"]))
        presented = machine.offered_key_fingerprint
        transaction.on_commit(
            lambda: machine_host_key_mismatch.send_robust(
                sender=Machine,
                machine_id=payload["machine_id"],
                team_id=payload["team_id"],
                presented=presented,
            )
        )


def _changed(machine: Machine, what: str) -> None:
    machine_id, team_id = machine.pk, machine.team_id
    transaction.on_commit(
        lambda: machine_changed.send_robust(
            sender=Machine, machine_id=machine_id, team_id=team_id, what=what
        )
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
    elif (refused := addresses.address_refusal(address)) is not None:
        errors["address"] = f"The platform does not connect to {refused}."
    if not (1 <= port <= 65535):
        errors["port"] = "An SSH port between 1 and 65535."
    if (
        not ssh_user
        or not ssh_user.replace("-", "").replace("_", "").replace(".", "").isalnum()
        or ssh_user.startswith("-")
    ):
        errors["ssh_user"] = "A user name: letters, digits, '-', '_', '.'."
    if not errors and Machine.objects.filter(team_id=team_id, address=address, port=port).exists():
        errors["address"] = "Your team has already registered this address and port."
    if errors:
        raise ValidationError(errors)
    machine = Machine.objects.create(
        team_id=team_id, name=(name.strip() or address)[:80], address=address, port=port,
        ssh_user=ssh_user,
    )  # fmt: skip
    _event(machine, "registered", f"Registered {ssh_user}@{address}:{port}")
    return machine


# How long a first contact may take before heartbeats try it again.
FIRST_CONTACT_GRACE = timedelta(minutes=1)


def machines_never_reached(now: datetime | None = None) -> list[int]:
    """Machines registered a while ago whose host key was never read: the first contact's task
    was lost. Reading a key again is harmless (nothing is trusted until confirmed)."""
    now = now or timezone.now()
    return list(
        Machine.objects.filter(
            status=MachineStatus.PENDING,
            host_key="",
            offered_key="",
            created_at__lt=now - FIRST_CONTACT_GRACE,
        ).values_list("pk", flat=True)
    )


def machine_fetch_host_key(*, machine_id: int) -> Machine:
    """Connect (without trusting) and remember the key the machine offers, for confirmation."""
    machine = Machine.objects.get(pk=machine_id)
    try:
        key = ssh.fetch_host_key(machine.address, machine.port)
    except ssh.HostUnreachable as error:
        with transaction.atomic():
            machine = Machine.objects.select_for_update().get(pk=machine_id)
            if machine.host_key:
                # A machine already set up keeps its status: heartbeats judge reachability.
                _event(machine, "key_read", f"Could not read the host key again: {error}")
            else:
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
        elif machine.status == MachineStatus.KEY_MISMATCH:
            # Even the old key back does not clear the flag by itself: a person decides.
            _event(
                machine,
                "key_read",
                f"The machine presents the pinned key {key.fingerprint} again; confirm it to "
                "bring the machine back.",
            )
    return machine


@transaction.atomic
def machine_confirm_host_key(*, machine_id: int, fingerprint: str) -> Machine:
    """Pin the offered key, if the provider confirms the fingerprint they saw.

    Only the key the machine itself presented (read without trusting it) can be pinned, and
    only by repeating its fingerprint, so a provider never pins a key they were not shown.
    After a key change this is also how a provider accepts the machine's new key.
    """
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    if not machine.offered_key or machine.offered_key_fingerprint != fingerprint.strip():
        raise ValidationError({"fingerprint": "This is not the fingerprint the machine presented."})
    previous = machine.host_key_fingerprint
    machine.host_key_type, machine.host_key = machine.offered_key_type, machine.offered_key
    machine.host_key_fingerprint = machine.offered_key_fingerprint
    machine.heartbeat_misses = 0
    machine.probe_attempted_at = None  # probe at once (the next heartbeat will, if nothing else)
    machine.save(
        update_fields=[
            "host_key_type", "host_key", "host_key_fingerprint", "heartbeat_misses",
            "probe_attempted_at",
        ]
    )  # fmt: skip
    if previous and previous != machine.host_key_fingerprint:
        _event(machine, "key_pinned", f"New host key {fingerprint} pinned (was {previous})")
    else:
        _event(machine, "key_pinned", f"Host key {fingerprint} confirmed and pinned")
    _set_status(machine, MachineStatus.PENDING, "Host key pinned; probing")
    # The pool notices the new key itself (it is part of a connection's identity).
    return machine


@transaction.atomic
def machine_flag_key_mismatch(*, machine_id: int, presented: ssh.RemoteHostKey) -> None:
    """Mark a machine whose host key changed; remember the new key for the provider to judge.

    Registered with the SSH pool (hosts.apps), so the first command of any room that meets a
    changed key flags the machine. The pinned key is kept: nothing runs until a person pins
    a key again.
    """
    machine = Machine.objects.select_for_update().filter(pk=machine_id).first()
    if machine is None or machine.host_key == presented.key_base64:
        return
    if machine.offered_key != presented.key_base64:
        machine.offered_key_type, machine.offered_key = presented.key_type, presented.key_base64
        machine.offered_key_fingerprint = presented.fingerprint
        machine.save(update_fields=["offered_key_type", "offered_key", "offered_key_fingerprint"])
    _set_status(
        machine,
        MachineStatus.KEY_MISMATCH,
        f"The machine now presents {presented.fingerprint}, not the pinned "
        f"{machine.host_key_fingerprint}; no command runs until a key is pinned again.",
    )


def flag_key_mismatch_handler(machine_id: int, presented: ssh.RemoteHostKey) -> None:
    """The pool's hook: flagging must never hide the HostKeyMismatch the caller gets."""
    try:
        machine_flag_key_mismatch(machine_id=machine_id, presented=presented)
    except Exception:
        logger.exception("could not flag machine %s after a host key mismatch", machine_id)


def machine_probe(*, machine_id: int) -> Machine:
    """Probe over SSH and store what could be read; flag GPUs that disappeared.

    A machine that was never probed cleanly goes to error on a failed probe (it is not in
    service yet; heartbeats re-probe it). A machine in service keeps its status and last good
    figures when a probe fails: the failure is an event and ``probe_problems``, and only
    ``probe_failures_allowed()`` failures in a row take it out of service (error). A machine
    that cannot be reached is left to the heartbeats, which judge reachability.
    """
    with transaction.atomic():
        Machine.objects.filter(pk=machine_id).update(probe_attempted_at=timezone.now())
    machine = Machine.objects.get(pk=machine_id)
    try:
        result = probe(machine)
    except ssh.HostKeyMismatch as error:
        if machine.host_key:
            with transaction.atomic():
                _set_status(
                    Machine.objects.select_for_update().get(pk=machine_id),
                    MachineStatus.KEY_MISMATCH,
                    str(error),
                )
        raise
    except ssh.HostUnreachable as error:
        _record_probe_failure(machine_id=machine_id, problems=[str(error)], counts=False)
        raise
    except (ssh.CommandFailed, ValueError) as error:
        _record_probe_failure(machine_id=machine_id, problems=[str(error)], counts=True)
        raise
    if (twin := _connected_twin(machine)) is not None:
        result.problems.append(twin)
    return machine_apply_probe(machine_id=machine_id, result=result)


def _connected_twin(machine: Machine) -> str | None:
    """Why this machine may not be used, if the same host (the same pinned host key) is
    already connected as another machine, of this team or another: listed twice, its GPUs
    could be rented twice. The first to be probed keeps it (the older, if both were). Only
    a team whose key the host let in gets this far."""
    others = Machine.objects.filter(host_key=machine.host_key).exclude(pk=machine.pk)
    if machine.probed_at is not None:
        others = others.filter(pk__lt=machine.pk)
    twin = others.exclude(probed_at=None).order_by("pk").first()
    if twin is None:
        return None
    if twin.team_id == machine.team_id:
        return f"This host is already connected as {twin.name}; a host is connected once."
    return "This host is already connected to the marketplace by another team; a host is connected once."


@transaction.atomic
def _record_probe_failure(*, machine_id: int, problems: list[str], counts: bool) -> Machine:
    """Note a failed probe; out of service only for a machine never set up, or after too many
    failures in a row (``counts``: the machine answered, its tools did not)."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    reason = "; ".join(problems)[:400]
    repeated = machine.status == MachineStatus.ERROR and machine.probe_problems == problems
    if counts:
        machine.probe_failures = min(machine.probe_failures + 1, 32767)
    machine.probe_problems = problems
    machine.save(update_fields=["probe_failures", "probe_problems"])
    if machine.probed_at is None:
        _set_status(machine, MachineStatus.ERROR, f"Probe failed: {reason}")
    elif counts and machine.probe_failures >= probe_failures_allowed():
        _set_status(
            machine,
            MachineStatus.ERROR,
            f"{machine.probe_failures} probes in a row failed: {reason}",
        )
    if not repeated and machine.status != MachineStatus.ERROR:
        tries = f" ({machine.probe_failures} in a row)" if counts else ""
        _event(
            machine,
            "probe_failed",
            f"Probe failed{tries}; keeping the figures of "
            f"{machine.probed_at:%Y-%m-%d %H:%M} UTC: {reason}",
        )
    _changed(machine, "probe")
    return machine


PROBED_FIGURES = ("cuda_version", "cpu_cores", "ram_mb", "disk_free_gb", "docker_version",
                  "nvidia_runtime", "os_name")  # fmt: skip


@transaction.atomic
def machine_apply_probe(*, machine_id: int, result: ProbeResult) -> Machine:
    """Store what the probe read. A figure it could not read (None) keeps its last value; GPUs
    are only synced when nvidia-smi answered, and then exactly the ones it no longer lists
    are flagged missing."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    # A machine stuck in error is re-probed every few minutes: one event per new finding.
    repeated = machine.status == MachineStatus.ERROR and machine.probe_problems == result.problems
    for name in PROBED_FIGURES:
        if getattr(result, name) is not None:
            setattr(machine, name, getattr(result, name))
    if result.gpus is not None:
        machine.driver_version = result.gpus[0].driver_version if result.gpus else ""
        _sync_gpus(machine, result.gpus)
    now = timezone.now()
    machine.last_heartbeat_at = now
    clean = not result.problems
    first = machine.probed_at is None
    if clean:
        machine.probed_at = now
        machine.probe_failures = 0
    else:
        machine.probe_failures = min(machine.probe_failures + 1, 32767)
    machine.probe_problems = list(result.problems)
    machine.save()
    gpus = f"{len(result.gpus)} GPU(s)" if result.gpus is not None else "GPUs unknown"
    summary = (
        f"{gpus}, {machine.cpu_cores} cores, {machine.ram_mb // 1024} GB RAM, "
        f"{machine.disk_free_gb} GB free"
    )
    if not repeated:
        _event(
            machine, "probed", summary + ("; " + "; ".join(result.problems) if not clean else "")
        )
    if clean:
        if machine.status in (MachineStatus.PENDING, MachineStatus.ERROR):
            _set_status(machine, MachineStatus.ONLINE, "Probe succeeded")
    elif first:
        _set_status(machine, MachineStatus.ERROR, "; ".join(result.problems))
    elif machine.probe_failures >= probe_failures_allowed():
        _set_status(
            machine,
            MachineStatus.ERROR,
            f"{machine.probe_failures} probes in a row found problems: "
            + "; ".join(result.problems),
        )
    _changed(machine, "probe")
    return machine


def _sync_gpus(machine: Machine, gpus: list) -> None:
    seen = set()
    for gpu in gpus:
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
            lambda uuid=missing.uuid, machine_id=machine.pk: gpu_missing.send_robust(
                sender=Machine, machine_id=machine_id, gpu_uuid=uuid
            )
        )


def machine_probe_due(machine: Machine, now: datetime | None = None) -> bool:
    """Whether a machine that just answered a heartbeat should be probed now: it is being set
    up, in error, or its last probe failed, and the retry interval has passed. This is how a
    machine recovers by itself."""
    if not machine.host_key or machine.heartbeat_misses:
        return False
    if machine.status in (MachineStatus.KEY_MISMATCH, MachineStatus.OFFLINE):
        return False
    if machine.status == MachineStatus.ONLINE and not machine.probe_failures:
        return False
    if machine.probe_attempted_at is None:
        return True
    waited = ((now or timezone.now()) - machine.probe_attempted_at).total_seconds()
    return waited >= probe_retry_seconds()


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
    """Listing terms. They apply to new rentals; running rentals keep the price they got.

    The end date may not come before the end of a rental already made (no rental may run
    past it); the machine row lock keeps a rental from being made meanwhile."""
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
    elif (
        end_date is not None and (committed := committed_until(machine_id)) and end_date < committed
    ):
        errors["end_date"] = (
            f"A rental on this machine runs until {committed:%Y-%m-%d %H:%M} UTC; "
            "the end date cannot come before it."
        )
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
    _event(machine, "terms", _terms_summary(machine))
    _changed(machine, "terms")
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
    _changed(machine, "listing")
    return machine


def machine_heartbeat(*, machine_id: int) -> Machine:
    """One heartbeat over the pooled connection: `true`, with a short timeout.

    K misses in a row (HOST_HEARTBEAT_MISSES) turn an online machine offline; the next
    answer turns an offline machine online again. It never clears a changed host key (only
    a person pinning a key does) nor an error (a clean probe does: see ``machine_probe_due``).
    Each attempt is recorded as a sample (with the GPUs rented at that moment) for the
    reliability score and the utilization chart. The SSH round trip happens before the
    transaction, so a dead machine never holds its row locked. A machine whose sessions are
    all busy was not asked, so that attempt is not recorded at all.
    """
    machine = Machine.objects.get(pk=machine_id)
    started = time.monotonic()
    failure = None
    try:
        ssh.run(machine, ["true"], timeout=HEARTBEAT_COMMAND_TIMEOUT, idempotent=True)
    except ssh.HostKeyMismatch as error:
        failure = ("key", str(error))
    except ssh.HostBusy as error:
        logger.info("heartbeat of machine %s skipped: %s", machine_id, error)
        return machine
    except (ssh.HostUnreachable, ssh.CommandFailed) as error:
        failure = ("miss", str(error))
        ssh.pool.forget(machine_id)
    latency = int((time.monotonic() - started) * 1000)
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        total, rented = _gpus_in_use(machine)
        HeartbeatSample.objects.create(
            machine=machine,
            ok=failure is None,
            latency_ms=latency if not failure else None,
            gpus_total=total,
            gpus_rented=rented,
        )
        now = timezone.now()
        if failure is None:
            machine.heartbeat_misses = 0
            machine.last_heartbeat_at = now
            if machine.status == MachineStatus.OFFLINE:
                _set_status(machine, MachineStatus.ONLINE, "Heartbeats answered again")
        elif failure[0] == "key":
            _set_status(machine, MachineStatus.KEY_MISMATCH, failure[1])
        else:
            machine.heartbeat_misses = min(machine.heartbeat_misses + 1, 32767)
            if (
                machine.heartbeat_misses >= heartbeat_misses_allowed()
                and machine.status == MachineStatus.ONLINE
            ):
                _set_status(
                    machine,
                    MachineStatus.OFFLINE,
                    f"{machine.heartbeat_misses} heartbeats missed: {failure[1]}",
                )
        machine.reliability = machine_reliability(machine, now=now)
        machine.save(update_fields=["heartbeat_misses", "last_heartbeat_at", "reliability"])
        _changed(machine, "heartbeat")
    return machine


# A heartbeat is `true` on an open connection (milliseconds); one that takes this long is a
# miss. With a dead connection the pool reconnects once, each connect bounded by
# ssh.CONNECT_TIMEOUT.
HEARTBEAT_COMMAND_TIMEOUT = 10.0


def offline_bound_seconds() -> int:
    """The longest a dead machine stays "online": K heartbeat periods plus the longest the
    last attempt can take: the command's timeout on a connection that went silent, then a
    reconnect and its retry, each of whose three steps (TCP, SSH banner, login) is bounded by
    the connect timeout (a host that accepts TCP and then says nothing uses all three)."""
    last_attempt = HEARTBEAT_COMMAND_TIMEOUT + 2 * 3 * ssh.CONNECT_TIMEOUT
    return int(heartbeat_seconds() * heartbeat_misses_allowed() + last_attempt)


def _gpus_in_use(machine: Machine) -> tuple[int, int]:
    from hosts.selectors import rented_gpu_ids

    present = list(machine.gpus.filter(present=True).values_list("pk", flat=True))
    rented = rented_gpu_ids([machine.pk])
    return len(present), sum(1 for gpu_id in present if gpu_id in rented)


def machine_reliability(machine: Machine, now: datetime | None = None) -> float:
    """Answered heartbeats ÷ heartbeats sent over the last 7 days (1.0 before any were sent).

    Every attempt counts the same, so an hour offline costs the same wherever it falls in
    the window, and the score recovers as old misses leave the window.
    """
    since = (now or timezone.now()) - RELIABILITY_WINDOW
    counts = HeartbeatSample.objects.filter(machine=machine, created_at__gte=since).aggregate(
        total=Count("pk"), ok=Count("pk", filter=Q(ok=True))
    )
    if not counts["total"]:
        return 1.0
    return round(counts["ok"] / counts["total"], 4)


def heartbeats_prune(*, older_than: timedelta = RELIABILITY_WINDOW * 2) -> int:
    """Delete samples that no score or chart reads any more; returns how many went."""
    deleted, _ = HeartbeatSample.objects.filter(created_at__lt=timezone.now() - older_than).delete()
    return deleted


def _terms_summary(machine: Machine) -> str:
    until = f", until {machine.end_date:%Y-%m-%d}" if machine.end_date else ""
    return (
        f"Terms: ${machine.price_per_gpu_hour / 1_000_000:.4g}/GPU-hour, "
        f"${machine.storage_price_per_gb_month / 1_000_000:.4g}/GB-month storage, "
        f"min {machine.min_gpus} GPU(s), region {machine.location or '—'}{until}"
    )


# --- Maintenance windows ------------------------------------------------------------------


@transaction.atomic
def maintenance_window_add(
    *, machine_id: int, starts_at: datetime, ends_at: datetime, note: str = ""
) -> MaintenanceWindow:
    """Announce a maintenance window. No new rental may overlap one (the scheduler asks
    ``hosts.selectors.maintenance_overlapping``); running rentals are not touched.

    A machine's windows never overlap each other: the machine row is locked while checking,
    so two concurrent adds cannot both pass.
    """
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    errors: dict[str, str] = {}
    now = timezone.now()
    if starts_at is None or timezone.is_naive(starts_at):
        errors["starts_at"] = "A start date and time with a time zone."
    if ends_at is None or timezone.is_naive(ends_at):
        errors["ends_at"] = "An end date and time with a time zone."
    if not errors:
        if ends_at <= starts_at:
            errors["ends_at"] = "The window must end after it starts."
        elif ends_at <= now:
            errors["ends_at"] = "The window is already over."
        elif ends_at - starts_at > MAX_MAINTENANCE:
            errors["ends_at"] = "A window lasts at most 14 days; unlist the machine instead."
        elif starts_at > now + MAINTENANCE_HORIZON:
            errors["starts_at"] = "At most a year ahead."
    note = (note or "").strip()
    if len(note) > 200:
        errors["note"] = "At most 200 characters."
    if not errors:
        clash = MaintenanceWindow.objects.filter(
            machine=machine, starts_at__lt=ends_at, ends_at__gt=starts_at
        ).first()
        if clash is not None:
            errors["starts_at"] = f"It overlaps the window {clash}."
    if errors:
        raise ValidationError(errors)
    window = MaintenanceWindow.objects.create(
        machine=machine, starts_at=max(starts_at, now), ends_at=ends_at, note=note
    )
    _event(
        machine,
        "maintenance",
        f"Maintenance {window.starts_at:%Y-%m-%d %H:%M}–{window.ends_at:%Y-%m-%d %H:%M} UTC"
        + (f": {note}" if note else ""),
    )
    _changed(machine, "maintenance")
    return window


@transaction.atomic
def maintenance_window_remove(*, machine_id: int, window_id: int) -> None:
    """Cancel a window of this machine (a window id of another machine changes nothing)."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    window = MaintenanceWindow.objects.filter(machine=machine, pk=window_id).first()
    if window is None:
        raise ValidationError({"window": "No such maintenance window on this machine."})
    window.delete()
    _event(machine, "maintenance", f"Maintenance {window} cancelled")
    _changed(machine, "maintenance")


# --- Removal --------------------------------------------------------------------------------


def machine_remove(*, machine_id: int) -> None:
    """Remove a machine that has never been rented (rentals keep their history, so a machine
    with any on record can only be unlisted). Its pooled connection is closed after commit."""
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        try:
            with transaction.atomic():
                machine.delete()
        except ProtectedError:
            raise ValidationError(
                {"machine": "It has rentals on record, so it stays; unlist it instead."}
            ) from None
        transaction.on_commit(lambda: ssh.pool.forget(machine_id))


# --- Self-test ------------------------------------------------------------------------------


def machine_self_test(*, machine_id: int, labels: dict[str, str] | None = None) -> Machine:
    """Probe, then run a small container with known limits and read them back from inside.

    Checks, each recorded with its detail: the probe; the image (pulled if missing); the
    container starts; the CPU and memory limits seen in its cgroup (v1 or v2) and its
    /dev/shm size match what was asked; an environment variable arrives; the GPUs are pinned
    (free GPUs only: a rented GPU is never handed to the test). The container is always
    removed. Nothing here holds a transaction while SSH runs.
    """
    from hosts.selftest import run_self_test

    checks = run_self_test(machine_id=machine_id, labels=labels or {})
    return _record_self_test(machine_id=machine_id, checks=checks)


@transaction.atomic
def _record_self_test(*, machine_id: int, checks: list[dict]) -> Machine:
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    passed = all(check["ok"] for check in checks)
    machine.self_test_at = timezone.now()
    machine.self_test_passed = passed
    machine.self_test_report = checks
    machine.save(update_fields=["self_test_at", "self_test_passed", "self_test_report"])
    failed = [check["name"] for check in checks if not check["ok"]]
    _event(
        machine,
        "self_test",
        "Self-test passed: " + ", ".join(c["name"] for c in checks)
        if passed
        else f"Self-test failed: {', '.join(failed)}",
    )
    _changed(machine, "self_test")
    return machine
