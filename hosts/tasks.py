"""Thin tasks over hosts.services: take ids, reload, return early if gone, call the service."""

from __future__ import annotations

import logging

from celery import shared_task

from hosts import services, ssh
from hosts.models import Machine, MachineStatus
from hosts.runtime import DockerHost
from hosts.verification import services as verification

logger = logging.getLogger(__name__)


@shared_task(name="hosts.tasks.machine_connect")
def machine_connect(machine_id: int) -> str:
    """First contact: read the host key the machine offers, for the provider to confirm."""
    if not Machine.objects.filter(pk=machine_id).exists():
        return "gone"
    return services.machine_fetch_host_key(machine_id=machine_id).status


@shared_task(name="hosts.tasks.machine_probe")
def machine_probe(machine_id: int) -> str:
    if not Machine.objects.filter(pk=machine_id).exclude(host_key="").exists():
        return "nothing to do"
    try:
        return services.machine_probe(machine_id=machine_id).status
    except (ssh.HostError, ValueError) as error:
        logger.info("probe of machine %s failed: %s", machine_id, error)
        return "failed"


@shared_task(name="hosts.tasks.machine_self_test")
def machine_self_test(machine_id: int) -> str:
    if not Machine.objects.filter(pk=machine_id).exclude(host_key="").exists():
        return "nothing to do"
    machine = services.machine_self_test(machine_id=machine_id)
    return "passed" if machine.self_test_passed else "failed"


@shared_task(name="hosts.tasks.machine_verify")
def machine_verify(machine_id: int) -> str:
    """A verification run: self-test, benchmark, verdict (hosts.verification)."""
    if not Machine.objects.filter(pk=machine_id).exclude(host_key="").exists():
        return "nothing to do"
    machine = verification.machine_verify(machine_id=machine_id)
    return "verified" if machine.verified else "not verified"


@shared_task(name="hosts.tasks.verifications_due")
def verifications_due() -> int:
    """Queue a run for each machine due one (claimed first, so no machine is queued twice)."""
    claimed = verification.machines_due_verification()
    for machine_id in claimed:
        machine_verify.delay(machine_id)
    return len(claimed)


@shared_task(name="hosts.tasks.heartbeats")
def heartbeats() -> int:
    """Fan out one heartbeat per machine with a pinned key, whatever its status: an offline
    machine comes back online, a machine in error is re-probed once it answers, and a machine
    with a changed key keeps its record (the pool runs nothing there). A heartbeat still
    queued when the next round starts is dropped (``expires``), so a slow worker never piles
    them up."""
    watched = list(Machine.objects.exclude(host_key="").values_list("pk", flat=True))
    for machine_id in watched:
        heartbeat.apply_async((machine_id,), expires=services.heartbeat_seconds())
    # First contact whose task was lost (a worker died with it): read the host key again, or
    # the machine would wait for its provider's confirmation of a key nobody read.
    for machine_id in services.machines_never_reached():
        machine_connect.apply_async((machine_id,), expires=services.heartbeat_seconds())
    return len(watched)


@shared_task(name="hosts.tasks.heartbeat", ignore_result=True)
def heartbeat(machine_id: int) -> str:
    """A heartbeat, then a probe if the machine answered and needs one (being set up, in
    error, or after a failed probe): how a machine recovers without anyone's help."""
    if not Machine.objects.filter(pk=machine_id).exists():
        return "gone"
    machine = services.machine_heartbeat(machine_id=machine_id)
    if services.machine_probe_due(machine):
        try:
            machine = services.machine_probe(machine_id=machine_id)
        except (ssh.HostError, ValueError) as error:
            logger.info("re-probe of machine %s failed: %s", machine_id, error)
            machine.refresh_from_db()
    return machine.status


@shared_task(name="hosts.tasks.reprobe_all")
def reprobe_all() -> int:
    """Refresh the figures of every machine commands can reach (heartbeats decide the rest)."""
    ids = list(
        Machine.objects.exclude(host_key="")
        .exclude(status__in=[MachineStatus.OFFLINE, MachineStatus.KEY_MISMATCH])
        .values_list("pk", flat=True)
    )
    for machine_id in ids:
        machine_probe.delay(machine_id)
    return len(ids)


@shared_task(name="hosts.tasks.heartbeats_prune", ignore_result=True)
def heartbeats_prune() -> int:
    return services.heartbeats_prune()


@shared_task(name="hosts.tasks.machine_mps_follow")
def machine_mps_follow(machine_id: int) -> str:
    """Start the CUDA MPS control daemon on a machine that shares its GPUs, or stop it on one
    that no longer does (no slice runs there then). Idempotent; a slice's launch starts it
    again if the host lost it meanwhile."""
    machine = Machine.objects.filter(pk=machine_id).exclude(host_key="").first()
    if machine is None or machine.status != MachineStatus.ONLINE:
        return "nothing to do"
    host = DockerHost(machine)
    try:
        if machine.sharing_enabled:
            host.mps_daemon_ensure()
            return "started"
        host.mps_daemon_stop()
        return "stopped"
    except ssh.HostError as error:
        logger.info("MPS daemon of machine %s not changed: %s", machine_id, error)
        return "failed"
