"""Heartbeats and reliability: one short command over the pooled connection per period that
asks the host's Docker Engine to answer; offline after K misses, degraded while SSH answers
and Docker does not; a sample per attempt for the 7-day reliability score and the utilization
chart."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from hosts import ssh
from hosts.models import HeartbeatSample, Machine, MachineStatus
from hosts.selectors import rented_gpu_ids
from hosts.services.events import notify_changed, set_status

logger = logging.getLogger(__name__)


RELIABILITY_WINDOW = timedelta(days=7)


def heartbeat_seconds() -> int:
    return int(getattr(settings, "HOST_HEARTBEAT_SECONDS", 30))


def heartbeat_misses_allowed() -> int:
    return int(getattr(settings, "HOST_HEARTBEAT_MISSES", 3))


def machine_heartbeat(*, machine_id: int) -> Machine:
    """One heartbeat over the pooled connection: Docker's version, with a short timeout.

    K misses in a row (HOST_HEARTBEAT_MISSES) turn an online machine offline; the next
    answer turns an offline machine online again. A host that answers while its Docker does
    not is degraded at once (its containers cannot be run, reached or trusted to be alive)
    and online again when Docker answers. It never clears a changed host key (only
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
        answer = ssh.run(
            machine, DOCKER_ANSWERS, timeout=HEARTBEAT_COMMAND_TIMEOUT, idempotent=True, check=False
        )
        if answer.exit_code != 0:
            failure = ("docker", (answer.stderr or answer.stdout).strip()[:300] or "no answer")
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
                set_status(machine, MachineStatus.ONLINE, "Heartbeats answered again")
            elif machine.status == MachineStatus.DEGRADED:
                set_status(machine, MachineStatus.ONLINE, "Its Docker Engine answers again")
        elif failure[0] == "docker":
            # SSH answered: the host is there, so this is no missed heartbeat.
            machine.heartbeat_misses = 0
            machine.last_heartbeat_at = now
            if machine.status in (MachineStatus.ONLINE, MachineStatus.OFFLINE):
                set_status(
                    machine,
                    MachineStatus.DEGRADED,
                    f"Its Docker Engine does not answer: {failure[1]}",
                )
        elif failure[0] == "key":
            set_status(machine, MachineStatus.KEY_MISMATCH, failure[1])
        else:
            machine.heartbeat_misses = min(machine.heartbeat_misses + 1, 32767)
            if machine.heartbeat_misses >= heartbeat_misses_allowed() and machine.status in (
                MachineStatus.ONLINE,
                MachineStatus.DEGRADED,
            ):
                set_status(
                    machine,
                    MachineStatus.OFFLINE,
                    f"{machine.heartbeat_misses} heartbeats missed: {failure[1]}",
                )
        machine.reliability = machine_reliability(machine, now=now)
        machine.save(update_fields=["heartbeat_misses", "last_heartbeat_at", "reliability"])
        notify_changed(machine, "heartbeat")
    return machine


# Asks the Docker Engine itself (the CLI alone answers without it), bounded on the host so a
# hung daemon reads as not answering rather than as a missed heartbeat.
DOCKER_ANSWERS = ["timeout", "5", "docker", "version", "--format", "{{.Server.Version}}"]
# A heartbeat is a short command on an open connection; one that takes this long is a
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
