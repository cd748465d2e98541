"""Starting a stopped or exited instance again, on the GPUs it had."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import OuterRef, Q
from django.utils import timezone

from hosts.models import Machine
from hosts.runtime import CommandFailed, DockerHost, HostUnreachable
from scheduler.models import Instance, InstanceState
from scheduler.services.allocations import (
    gpu_allocation_reclaim,
    gpu_allocation_release,
    holding_gpus,
    instance_holds_gpus,
)
from scheduler.services.containers import container_removed
from scheduler.services.errors import InvalidTransition
from scheduler.services.interruption import gpus_vacate
from scheduler.services.transitions import instance_transition

# How long a start may hold a stopped instance's GPUs before it counts as dead.
# instance_start commits the GPUs it takes back before it runs `docker start` over SSH (which
# times out long before this); a start whose worker died in between would otherwise hold them
# for good, so machine_reconcile gives them back once this has passed.
START_LEASE = timedelta(minutes=10)


def start_under_way() -> Q:
    """Filter for stopped instances that instance_start has taken GPUs back for and not yet
    moved on.

    Every transition into the stopped state releases the GPUs, so live GPUs on a stopped
    instance are a start's (for START_LEASE). Its container may already run: it is the
    start's, not a leftover, and its GPUs must not be freed under it.
    """
    return holding_gpus(
        instance=OuterRef("pk"),
        instance__state=InstanceState.STOPPED,
        created_at__gt=timezone.now() - START_LEASE,
    )


def instance_start(*, instance_id: int, reason: str = "Started by the renter") -> Instance:
    """Take the GPUs back (409 if someone else has them) and start the container again.

    A stopped instance that has no container (stopped while it was launching) is launched
    again instead: it becomes launching, in the transaction that takes its GPUs back, and the
    caller queues the launch (a pull can take long; it never runs in a request).

    Otherwise the GPUs are committed before the container starts, so meanwhile the instance is
    still stopped but holds GPUs: machine_reconcile leaves it alone and instance_expire stops
    its container (``start_under_way``). It becomes running only if, when the container has
    started, it is still in the state it was started from and holds its GPUs; otherwise
    (expired, destroyed, or freed as a dead start meanwhile) its container is stopped again.
    """
    machine_id = Instance.objects.values_list("machine_id", flat=True).get(pk=instance_id)
    with transaction.atomic():
        # The machine before the instance, the order renting and reclaiming take them in.
        Machine.objects.select_for_update().get(pk=machine_id)
        instance = (
            Instance.objects.select_for_update(of=("self",))
            .select_related("machine")
            .get(pk=instance_id)
        )
        from_state = instance.state
        if from_state not in (InstanceState.STOPPED, InstanceState.EXITED):
            raise InvalidTransition(f"An instance that is {from_state} cannot be started.")
        # A stopped instance already holding its GPUs won them back (an interrupted rental
        # that won again took them in the same transaction that made it the winner).
        if from_state == InstanceState.STOPPED and not instance_holds_gpus(instance):
            gpu_allocation_reclaim(instance=instance)
        if not instance.container_id:
            return instance_transition(
                instance_id=instance_id,
                to_state=InstanceState.LAUNCHING,
                reason="Launching again",
                work_due_at=timezone.now(),
                attempts=0,
                progress=0,
            )
    host = DockerHost(instance.machine)
    try:
        gpus_vacate(host, instance)
        host.volumes_ensure([name for name, _ in instance.volumes])
        host.start(instance.container_id)
    except (CommandFailed, HostUnreachable):
        if from_state == InstanceState.STOPPED:
            with transaction.atomic():
                # Not if it moved on meanwhile: an expiry that could not confirm the container
                # stopped keeps the GPUs for machine_reconcile to release.
                locked = Instance.objects.select_for_update().get(pk=instance_id)
                if locked.state == from_state:
                    gpu_allocation_release(instance=instance)
        raise
    with transaction.atomic():
        current = Instance.objects.select_for_update().get(pk=instance_id)
        still_ours = current.state == from_state and (
            from_state != InstanceState.STOPPED or instance_holds_gpus(current)
        )
        if still_ours:
            return instance_transition(
                instance_id=instance_id,
                to_state=InstanceState.RUNNING,
                reason=reason,
            )
    if current.state == InstanceState.RUNNING:
        return current  # exited, and reconcile saw the container running again first
    if current.state in (InstanceState.STOPPING, InstanceState.DESTROYING):
        return current  # a stop or destroy asked for meanwhile acts on the container itself
    # It moved on while the container started: it must not run on GPUs it no longer holds.
    container_removed(
        host, instance.container_id, stop_only=current.state != InstanceState.DESTROYED
    )
    raise InvalidTransition(f"The instance became {current.state} while it was starting.")
