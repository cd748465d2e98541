"""Stopping and destroying: the request moves the state at once; a worker holding the lease
does the host's part and retries until the host confirms."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from hosts.runtime import CommandFailed, DockerHost, HostKeyMismatch, HostUnreachable
from scheduler.models import Instance, InstanceState
from scheduler.services.containers import container_gone_or_stopped, instance_container_ref
from scheduler.services.errors import InvalidTransition
from scheduler.services.leased_work import WorkOutcome, leased, waiting_for_host
from scheduler.services.transitions import instance_transition, state_of
from scheduler.services.versions import versions_remove_containers

# States a stop may be asked for in.
STOPPABLE_STATES = {
    InstanceState.LAUNCHING,
    InstanceState.RUNNING,
    InstanceState.PAUSED,
    InstanceState.EXITED,
    InstanceState.UNKNOWN,
}


def instance_stop_request(
    *, instance_id: int, reason: str = "Stop asked for by the renter"
) -> Instance:
    """Ask for a stop: the instance is stopping at once (its GPU time is no longer charged) and
    keeps its GPUs until a worker has seen the container stop (``instance_stop``)."""
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.STOPPING,
        reason=reason,
        only_from=STOPPABLE_STATES,
        work_due_at=timezone.now(),
        attempts=0,
    )
    if moved is None:
        state = state_of(instance_id)
        raise InvalidTransition(f"An instance that is {state} cannot be stopped.")
    return moved


def instance_stop(*, instance_id: int) -> WorkOutcome:
    """The work of a stopping instance: stop its container, then give its GPUs back. Retried
    (with backoff) until the host confirms; its disk (and storage charge) stays."""
    return _container_work(
        instance_id,
        InstanceState.STOPPING,
        InstanceState.STOPPED,
        what="Stopping",
        remove=False,
        reason="Stopped: the container is stopped and its GPUs are free",
    )


def instance_destroy_request(
    *, instance_id: int, reason: str = "Destroyed by the renter"
) -> Instance:
    """Ask for the container and its data to go: the instance is destroying at once (the
    rental ends and settles now) and keeps its GPUs until a worker has removed the container
    (``instance_destroy``). Asking again changes nothing."""
    with transaction.atomic():
        state = (
            Instance.objects.select_for_update().values_list("state", flat=True).get(pk=instance_id)
        )
        if state in (InstanceState.DESTROYING, InstanceState.DESTROYED):
            return Instance.objects.get(pk=instance_id)
        return instance_transition(
            instance_id=instance_id,
            to_state=InstanceState.DESTROYING,
            reason=reason,
            work_due_at=timezone.now(),
            attempts=0,
        )


def instance_destroy(*, instance_id: int) -> WorkOutcome:
    """The work of a destroying instance: remove its container and data, then release every
    allocation. Retried (with backoff) until the host confirms."""
    return _container_work(
        instance_id,
        InstanceState.DESTROYING,
        InstanceState.DESTROYED,
        what="Destroying",
        remove=True,
        reason="Destroyed: the container and its data are removed",
    )


def _container_work(
    instance_id: int, state: str, to_state: str, *, what: str, remove: bool, reason: str
) -> WorkOutcome:
    """Under the lease for ``state``: stop (or remove) the container, then move to
    ``to_state``; a host that does not confirm means a later try."""

    def work(token: str) -> WorkOutcome:
        instance = Instance.objects.select_related("machine").get(pk=instance_id)
        try:
            host = DockerHost(instance.machine)
            if remove:
                _keep_log_tail(host, instance)
            container_gone_or_stopped(host, instance_container_ref(instance), remove=remove)
            if remove:
                versions_remove_containers(host, instance)
        except (HostUnreachable, HostKeyMismatch, CommandFailed) as error:
            return waiting_for_host(instance, what, error)
        moved = instance_transition(
            instance_id=instance_id,
            to_state=to_state,
            reason=reason,
            only_from={state},
            container_stopped=True,  # Docker answered: removed, stopped, or not there
        )
        return WorkOutcome(instance_id, moved.state if moved else state_of(instance_id))

    return leased(instance_id, state, work)


# Enough lines to see how a run ended; the log itself may have been any size.
KEPT_LOG_LINES = 200
KEPT_LOG_CHARS = 64 * 1024


def _keep_log_tail(host: DockerHost, instance: Instance) -> None:
    """Save the container's last lines on the instance before the container goes, so an ended
    rental still shows them. A container already gone (a retry, or one never made) keeps what
    was saved before."""
    try:
        text = host.logs(instance_container_ref(instance), tail=KEPT_LOG_LINES)
    except CommandFailed:
        return
    # PostgreSQL text holds no NUL, which a container may well have written.
    kept = text[-KEPT_LOG_CHARS:].replace("\x00", "")
    Instance.objects.filter(pk=instance.pk).update(last_log=kept)
