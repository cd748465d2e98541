"""Probing: read the hardware over SSH, store what was read, count failed probes, and decide
when a machine that answers heartbeats is probed again (how it recovers by itself)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from hosts import ssh
from hosts.models import Gpu, Machine, MachineStatus
from hosts.probe import ProbeResult, probe
from hosts.runtime.firewall import firewall_ensure
from hosts.services.events import notify_changed, record_event, set_status
from hosts.signals import gpu_missing
from hosts.verification.marks import hardware_signature


def probe_failures_allowed() -> int:
    """Failed probes in a row (tools failing on a machine that answers) before it is taken
    out of service: one bad nvidia-smi must not stop every rental on the machine."""
    return int(getattr(settings, "HOST_PROBE_FAILURES", 3))


def probe_retry_seconds() -> int:
    """How soon a machine that answers heartbeats is probed again after a failed probe (or
    while it is in error or being set up), so it recovers without anyone pressing a button."""
    return int(getattr(settings, "HOST_PROBE_RETRY_SECONDS", 300))


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
                set_status(
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
    # Setting the machine up is part of every probe: a host rebooted or re-installed since
    # (rules gone) gets them again. Missing rules are told on the machine, not a problem
    # that takes it out of service.
    firewall = firewall_ensure(machine)
    if firewall.ok:
        Machine.objects.filter(pk=machine_id).update(
            firewall_ranges=list(machine.blocked_ranges or [])
        )
    result = replace(result, tenant_firewall=firewall.ok, tenant_firewall_detail=firewall.detail)
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
        set_status(machine, MachineStatus.ERROR, f"Probe failed: {reason}")
    elif counts and machine.probe_failures >= probe_failures_allowed():
        set_status(
            machine,
            MachineStatus.ERROR,
            f"{machine.probe_failures} probes in a row failed: {reason}",
        )
    if not repeated and machine.status != MachineStatus.ERROR:
        tries = f" ({machine.probe_failures} in a row)" if counts else ""
        record_event(
            machine,
            "probe_failed",
            f"Probe failed{tries}; keeping the figures of "
            f"{machine.probed_at:%Y-%m-%d %H:%M} UTC: {reason}",
        )
    notify_changed(machine, "probe")
    return machine


PROBED_FIGURES = ("cuda_version", "cpu_cores", "ram_mb", "disk_free_gb", "docker_version",
                  "nvidia_runtime", "os_name", "mps_available", "disk_enforced",
                  "tenant_firewall", "tenant_firewall_detail")  # fmt: skip


@transaction.atomic
def machine_apply_probe(*, machine_id: int, result: ProbeResult) -> Machine:
    """Store what the probe read. A figure it could not read (None) keeps its last value; GPUs
    are only synced when nvidia-smi answered, and then exactly the ones it no longer lists
    are flagged missing."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    # A machine stuck in error is re-probed every few minutes: one event per new finding.
    repeated = machine.status == MachineStatus.ERROR and machine.probe_problems == result.problems
    firewall_was = (machine.tenant_firewall, machine.tenant_firewall_detail)
    for name in PROBED_FIGURES:
        if getattr(result, name) is not None:
            setattr(machine, name, getattr(result, name))
    hardware_was = hardware_signature(list(machine.gpus.filter(present=True)), machine.cpu_cores)
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
    hardware_now = hardware_signature(list(machine.gpus.filter(present=True)), machine.cpu_cores)
    if not first and hardware_now != hardware_was:
        # Figures measured on other hardware say nothing about this one: measure it again now.
        machine.verification_due_at = now
        record_event(machine, "hardware_changed", "The hardware changed; verification runs again")
    machine.save()
    gpus = f"{len(result.gpus)} GPU(s)" if result.gpus is not None else "GPUs unknown"
    summary = (
        f"{gpus}, {machine.cpu_cores} cores, {machine.ram_mb // 1024} GB RAM, "
        f"{machine.disk_free_gb} GB free"
    )
    if result.tenant_firewall is False and firewall_was != (False, result.tenant_firewall_detail):
        record_event(machine, "tenant_firewall_missing", result.tenant_firewall_detail or "")
    if not repeated:
        record_event(
            machine, "probed", summary + ("; " + "; ".join(result.problems) if not clean else "")
        )
    if clean:
        if machine.status in (MachineStatus.PENDING, MachineStatus.ERROR):
            set_status(machine, MachineStatus.ONLINE, "Probe succeeded")
    elif first:
        set_status(machine, MachineStatus.ERROR, "; ".join(result.problems))
    elif machine.probe_failures >= probe_failures_allowed():
        set_status(
            machine,
            MachineStatus.ERROR,
            f"{machine.probe_failures} probes in a row found problems: "
            + "; ".join(result.problems),
        )
    notify_changed(machine, "probe")
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
        record_event(
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
    if machine.status in (
        MachineStatus.KEY_MISMATCH,
        MachineStatus.OFFLINE,
        MachineStatus.DEGRADED,
    ):
        return False  # heartbeats bring these back
    if machine.status == MachineStatus.ONLINE and not machine.probe_failures:
        return False
    if machine.probe_attempted_at is None:
        return True
    waited = ((now or timezone.now()) - machine.probe_attempted_at).total_seconds()
    return waited >= probe_retry_seconds()
