"""Pause, continue and restart a running instance's container (``docker pause``, ``unpause``,
``restart``). Each is quick on the host, so the request does it over the pooled connection
and then moves the instance on; no row lock is held while the host answers.

A paused instance keeps its GPUs (and their charge: nobody else can rent them meanwhile); its
processes are frozen, so commands cannot run in it until it continues.
"""

from __future__ import annotations

from hosts.runtime import DockerHost
from scheduler.models import Instance, InstanceState
from scheduler.services.errors import InvalidTransition
from scheduler.services.transitions import instance_transition, state_of


def _instance(instance_id: int, allowed: set[str], doing: str) -> Instance:
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    if instance.state not in allowed or not instance.container_id:
        hint = " Continue it first." if instance.state == InstanceState.PAUSED else ""
        raise InvalidTransition(f"An instance that is {instance.state} cannot be {doing}.{hint}")
    return instance


def _moved(instance_id: int, moved: Instance | None, doing: str) -> Instance:
    if moved is None:  # someone moved it on while the host answered (a stop, a destroy)
        raise InvalidTransition(
            f"The instance became {state_of(instance_id)} while it was being {doing}."
        )
    return moved


def instance_pause(*, instance_id: int, reason: str = "Paused by the renter") -> Instance:
    instance = _instance(instance_id, {InstanceState.RUNNING}, "paused")
    DockerHost(instance.machine).pause(instance.container_id)
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.PAUSED,
        reason=reason,
        only_from={InstanceState.RUNNING},
    )
    return _moved(instance_id, moved, "paused")


def instance_continue(*, instance_id: int, reason: str = "Continued by the renter") -> Instance:
    instance = _instance(instance_id, {InstanceState.PAUSED}, "continued")
    DockerHost(instance.machine).unpause(instance.container_id)
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.RUNNING,
        reason=reason,
        only_from={InstanceState.PAUSED},
    )
    return _moved(instance_id, moved, "continued")


def instance_restart(*, instance_id: int, reason: str = "Restarted by the renter") -> Instance:
    """Restart the container in place (same GPUs, ports, data): from running or exited."""
    allowed = {InstanceState.RUNNING, InstanceState.EXITED}
    instance = _instance(instance_id, allowed, "restarted")
    DockerHost(instance.machine).restart(instance.container_id)
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.RUNNING,
        reason=reason,
        only_from=allowed,
        exit_code=None,
    )
    return _moved(instance_id, moved, "restarted")
