"""Heartbeats and reliability: one short command over the pooled connection per period that
asks the host's Docker Engine to answer; offline after K misses, degraded while SSH answers
and Docker does not; a sample per attempt for the reliability score and the utilization
chart, and the score's history."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from hosts import ssh
from hosts.models import HeartbeatSample, Machine, MachineEvent, MachineStatus, ReliabilityRecord
from hosts.selectors import rented_gpu_ids
from hosts.services.events import notify_changed, record_event, set_status
from hosts.verification.marks import machine_reliability_judge

logger = logging.getLogger(__name__)


RELIABILITY_WINDOW = timedelta(days=float(getattr(settings, "HOST_RELIABILITY_WINDOW_DAYS", 7)))
# How often the score is kept as history (one row per machine per period).
RELIABILITY_RECORD_EVERY = timedelta(hours=1)
# What a container the host killed costs its rental, in rented time that was not runnable:
# the work since its last checkpoint is lost, and an hour is a common checkpoint interval.
HOST_KILL_COST = timedelta(hours=1)
CONTAINER_KILLED = "container_killed"


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
        _record_reliability(machine, now)
        machine_reliability_judge(machine)
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
    """The share of rented time in which the machine's rentals were runnable, over the last
    ``RELIABILITY_WINDOW`` (``reliability_figures``); a machine rented at no moment of the
    window is judged by its heartbeats alone (answered ÷ sent; 1.0 before any were sent)."""
    return reliability_figures(machine, now=now)[0]


def reliability_figures(machine: Machine, now: datetime | None = None) -> tuple[float, int, int]:
    """(reliability, rented GPU-seconds, runnable GPU-seconds) over the window.

    Each heartbeat stands for one heartbeat period of each GPU rented at that moment: runnable
    when it was answered with Docker answering (a missed heartbeat or a degraded machine is
    not), and each container the host killed (``machine_container_killed``) takes
    ``HOST_KILL_COST`` of runnable time off. Weighting by rented GPUs makes an outage cost as
    much as the rentals it stopped, and an outage of an idle machine costs nothing here.
    """
    now = now or timezone.now()
    since = now - RELIABILITY_WINDOW
    samples = HeartbeatSample.objects.filter(machine=machine, created_at__gte=since)
    counts = samples.aggregate(
        sent=Count("pk"),
        answered=Count("pk", filter=Q(ok=True)),
        rented=Sum("gpus_rented", filter=Q(gpus_rented__gt=0)),
        runnable=Sum("gpus_rented", filter=Q(gpus_rented__gt=0, ok=True)),
    )
    period = heartbeat_seconds()
    rented = (counts["rented"] or 0) * period
    if not rented:
        if not counts["sent"]:
            return 1.0, 0, 0
        return round(counts["answered"] / counts["sent"], 4), 0, 0
    killed = MachineEvent.objects.filter(
        machine=machine, kind=CONTAINER_KILLED, created_at__gte=since
    ).count()
    runnable = max(
        (counts["runnable"] or 0) * period - killed * int(HOST_KILL_COST.total_seconds()), 0
    )
    return round(runnable / rented, 4), rented, runnable


def _record_reliability(machine: Machine, now: datetime) -> None:
    """Keep the score as history, once per ``RELIABILITY_RECORD_EVERY``."""
    last = (
        ReliabilityRecord.objects.filter(machine=machine)
        .order_by("-recorded_at")
        .values_list("recorded_at", flat=True)
        .first()
    )
    if last is not None and now - last < RELIABILITY_RECORD_EVERY:
        return
    score, rented, runnable = reliability_figures(machine, now=now)
    ReliabilityRecord.objects.create(
        machine=machine,
        recorded_at=now,
        reliability=score,
        rented_seconds=rented,
        runnable_seconds=runnable,
    )


@transaction.atomic
def machine_container_killed(*, machine_id: int, container: str, reason: str) -> None:
    """The host killed a rental's container (it vanished, or stopped while the host was away):
    recorded as an event of the machine, which reliability counts."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    record_event(machine, CONTAINER_KILLED, f"{container[:12]}: {reason}")
    machine.reliability = machine_reliability(machine)
    machine.save(update_fields=["reliability"])
    machine_reliability_judge(machine)
    notify_changed(machine, "reliability")


def heartbeats_prune(*, older_than: timedelta = RELIABILITY_WINDOW * 2) -> int:
    """Delete samples that no score or chart reads any more; returns how many went."""
    deleted, _ = HeartbeatSample.objects.filter(created_at__lt=timezone.now() - older_than).delete()
    return deleted
