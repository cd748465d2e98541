"""Renter actions on a rental: one place for the console and the API.

The request changes the state at once (and with it what is charged); the work on the host is
queued on commit for a worker that tries until the host confirms.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from core.db import release_database_connection
from hosts.runtime import CommandResult, DockerHost
from marketplace.models import Rental
from marketplace.validation import label_check
from scheduler.models import Instance, InstanceState
from scheduler.services import (
    InvalidTransition,
    instance_continue,
    instance_destroy_request,
    instance_pause,
    instance_restart,
    instance_start,
    instance_stop_request,
)
from scheduler.work import work_enqueue_on_commit


def rental_stop_request(*, instance: Instance) -> Instance:
    """Stop: the instance is stopping at once (GPU time is no longer charged from now) and a
    worker stops its container, trying until the host confirms; then its GPUs go back. Its
    storage is still charged."""
    with transaction.atomic():
        stopping = instance_stop_request(instance_id=instance.pk)
        work_enqueue_on_commit(instance.pk, InstanceState.STOPPING)
    return stopping


def rental_destroy_request(
    *, instance: Instance, reason: str = "Destroyed by the renter"
) -> Instance:
    """Destroy: the rental ends and settles at once (nothing is charged from now), and a worker
    removes the container and its data, trying until the host confirms."""
    with transaction.atomic():
        destroying = instance_destroy_request(instance_id=instance.pk, reason=reason)
        if destroying.state == InstanceState.DESTROYING:
            work_enqueue_on_commit(instance.pk, InstanceState.DESTROYING)
    return destroying


def rental_start(*, instance: Instance) -> Instance:
    """Start again with the same GPUs (409 if someone has them), within the rental period. A
    rental stopped before its container existed is launched again by a worker."""
    if instance.state == InstanceState.FAILED:
        raise InvalidTransition(
            "This rental ended when it failed, and nothing was charged after that; rent again."
        )
    if instance.rental.ends_at <= timezone.now():
        raise InvalidTransition("The rental period is over; extend it first.")
    # Not inside a transaction: instance_start commits the GPUs it takes back before it runs
    # `docker start` over SSH, which must hold no row locks.
    started = instance_start(instance_id=instance.pk)
    if started.state == InstanceState.LAUNCHING:
        work_enqueue_on_commit(instance.pk, InstanceState.LAUNCHING)
    # An interrupted rental the renter started (its GPUs were free) no longer waits.
    Rental.objects.filter(instance_id=instance.pk).exclude(interrupted_at=None).update(
        interrupted_at=None
    )
    return started


def _within_period(instance: Instance) -> None:
    if instance.rental.ends_at <= timezone.now():
        raise InvalidTransition("The rental period is over; extend it first.")


def rental_pause(*, instance: Instance) -> Instance:
    """Freeze the container's processes; its GPUs stay allocated and charged."""
    _within_period(instance)
    return instance_pause(instance_id=instance.pk)


def rental_continue(*, instance: Instance) -> Instance:
    _within_period(instance)
    return instance_continue(instance_id=instance.pk)


def rental_restart(*, instance: Instance) -> Instance:
    """Restart the container in place (its command runs again; its files stay)."""
    _within_period(instance)
    return instance_restart(instance_id=instance.pk)


# A command run from a request holds it (and its worker thread) meanwhile: bounded.
EXEC_TIMEOUT = 30.0


def rental_exec(*, instance: Instance, command: str) -> CommandResult:
    """Run a shell command inside the renter's own running container, for at most
    EXEC_TIMEOUT seconds."""
    if instance.state == InstanceState.PAUSED:
        raise InvalidTransition(
            "The instance is paused: its processes are frozen. Continue it to run commands."
        )
    if instance.state != InstanceState.RUNNING:
        raise InvalidTransition("Commands run only in a running instance.")
    host = DockerHost(instance.machine)
    release_database_connection()
    return host.exec(instance.container_id, ["sh", "-c", command], timeout=EXEC_TIMEOUT)


def instance_label(*, instance: Instance, label: str) -> Instance:
    """Name the instance (the renter's own text; "" removes it). Nothing on the host changes."""
    label = label.strip()
    label_check(label)
    Instance.objects.filter(pk=instance.pk).update(label=label)
    instance.label = label
    return instance
