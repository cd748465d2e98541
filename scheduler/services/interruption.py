"""Interrupting an instance: another rental takes its GPUs now, and it stops.

An ordinary stop keeps the GPUs until a worker has seen the container stop. An interruption
cannot wait for that: the rental that outbid it holds the GPUs from the same transaction. So
the GPUs change hands at once in the database, and the container of the rental that took them
runs only after ``gpus_vacate`` has stopped the interrupted one's: two containers never run
on one GPU, and the GPUs never belong to two rentals.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef
from django.utils import timezone

from hosts.runtime import CommandFailed, DockerHost
from scheduler.models import GpuAllocation, Instance, InstanceState
from scheduler.services.allocations import gpu_allocation_release, live_gpu_allocations
from scheduler.services.containers import container_gone_or_stopped, instance_container_ref
from scheduler.services.errors import InvalidTransition
from scheduler.services.transitions import instance_transition, state_of

# What an interruption may stop: an instance that holds its GPUs for its own use. One that is
# stopping or destroying gives them back soon anyway, and a stopped one holding GPUs is a
# start under way.
INTERRUPTIBLE_STATES = {
    InstanceState.LAUNCHING,
    InstanceState.RUNNING,
    InstanceState.PAUSED,
    InstanceState.EXITED,
}


VACATE_ATTEMPTS = 3


def instance_interrupt(*, instance_id: int, reason: str) -> Instance:
    """Stop the instance now and give its GPUs up at once (the caller holds the machine's
    lock and hands them to the rental that took them). It is stopping from now, so its GPU
    time ends; a worker stops its container, as for any stop (the caller queues that work)."""
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.STOPPING,
        reason=reason,
        only_from=INTERRUPTIBLE_STATES,
        work_due_at=timezone.now(),
        attempts=0,
    )
    if moved is None:
        raise InvalidTransition(
            f"An instance that is {state_of(instance_id)} cannot be interrupted."
        )
    gpu_allocation_release(instance=moved)
    return moved


def interrupted_on_gpus(instance: Instance) -> list[Instance]:
    """Instances interrupted for the GPUs ``instance`` holds whose containers may still run:
    stopping, without GPUs of their own, last on one of these GPUs."""
    stopping = Instance.objects.filter(
        machine_id=instance.machine_id, state=InstanceState.STOPPING
    ).exclude(pk=instance.pk)
    if not stopping.exists():
        # Nearly every launch: one plain look-up instead of composing the one below.
        return []
    gpu_ids = live_gpu_allocations().filter(instance=instance).values("gpu_id")
    were_on = GpuAllocation.objects.filter(
        instance=OuterRef("pk"), gpu_id__in=gpu_ids, released_at__isnull=False
    )
    holds_some = live_gpu_allocations().filter(instance=OuterRef("pk"))
    return list(stopping.filter(Exists(were_on)).exclude(Exists(holds_some)))


def gpus_vacate(host: DockerHost, instance: Instance) -> None:
    """Before ``instance``'s container runs on its GPUs: stop the containers of the instances
    interrupted for them that are still running (their own stop work may not have run yet;
    it finds them stopped then). Raises what ``container_gone_or_stopped`` raises when the
    host cannot confirm, so the caller does not run on GPUs still in use."""
    for interrupted in interrupted_on_gpus(instance):
        for attempt in range(VACATE_ATTEMPTS):
            try:
                container_gone_or_stopped(host, instance_container_ref(interrupted), remove=False)
                break
            except CommandFailed:
                # Its launch may be creating the container right now: `docker stop` found no
                # container, and the look-up a moment later found one. Stop it again.
                if attempt == VACATE_ATTEMPTS - 1:
                    raise
