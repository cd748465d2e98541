"""The instance state machine: every state change goes through ``instance_transition``."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from scheduler.models import GPU_HOLDING_STATES, TRANSITIONS, Instance, InstanceEvent, InstanceState
from scheduler.services.allocations import allocation_release_all, gpu_allocation_release
from scheduler.services.errors import InvalidTransition, LaunchInterrupted
from scheduler.signals import instance_progress, instance_state_changed


def instance_transition(
    *,
    instance_id: int,
    to_state: str,
    reason: str,
    only_from: set[str] | None = None,
    container_stopped: bool | None = None,
    launched_as_asked: bool = False,
    **fields,
) -> Instance | None:
    """Move an instance to ``to_state`` and record why; publish on commit.

    Returns None (and changes nothing) when the instance is not in ``only_from`` — the way a
    re-delivered or late task learns someone else already moved it on.

    A move to a state that holds no GPUs must say whether the host confirmed the container
    stopped (``container_stopped``), and only then are the GPUs given back: a host that did
    not answer may still run it on them, and renting them to someone else would put two
    renters on one GPU. The caller cannot forget to say it (leaving it out raises), and
    ``machine_reconcile`` releases GPUs kept this way once Docker lists the container stopped.

    ``launched_as_asked`` tells listeners that a launch started the very container it was
    asked for, on what the instance already held: no GPU, slice or port changed hands (the
    machine's offer is as it was) and the rental already follows this version (unlike a
    failed version's fallback, which moves to ``running`` too).
    """
    with transaction.atomic():
        instance = Instance.objects.select_for_update().get(pk=instance_id)
        from_state = instance.state
        if only_from is not None and from_state not in only_from:
            return None
        if to_state != from_state and to_state not in TRANSITIONS[from_state]:
            raise InvalidTransition(f"An instance that is {from_state} cannot become {to_state}.")
        if to_state not in GPU_HOLDING_STATES and container_stopped is None:
            raise TypeError(
                f"moving instance {instance_id} to {to_state} needs container_stopped: did the "
                "host confirm its container stopped?"
            )
        instance.state = to_state
        instance.status_message = reason[:500]
        instance.state_changed_at = timezone.now()
        for name, value in fields.items():
            setattr(instance, name, value)
        # The row is locked: writing only what changed is the same as writing it all.
        instance.save(update_fields=["state", "status_message", "state_changed_at", *fields])
        InstanceEvent.objects.create(
            instance=instance, from_state=from_state, to_state=to_state, reason=reason[:500]
        )
        if to_state not in GPU_HOLDING_STATES and container_stopped:
            gpu_allocation_release(instance=instance)
            if to_state == InstanceState.DESTROYED:
                allocation_release_all(instance=instance)
        payload = {
            "instance_id": instance.pk,
            "team_id": instance.team_id,
            "machine_id": instance.machine_id,
            "from_state": from_state,
            "to_state": to_state,
            "reason": reason,
            "launched_as_asked": launched_as_asked,
        }
        transaction.on_commit(
            lambda: instance_state_changed.send_robust(sender=Instance, **payload)
        )
    return instance


def instance_report_progress(*, instance: Instance, progress: int, message: str) -> None:
    """Show launch progress. Raises LaunchInterrupted when the instance is no longer launching
    (the renter stopped or destroyed it), so a long pull ends at its next progress line."""
    still_launching = Instance.objects.filter(pk=instance.pk, state=InstanceState.LAUNCHING).update(
        progress=progress, status_message=message[:500]
    )
    if not still_launching:
        raise LaunchInterrupted(f"instance {instance.pk} is no longer launching")
    instance_progress.send_robust(
        sender=Instance,
        instance_id=instance.pk,
        team_id=instance.team_id,
        progress=progress,
        message=message,
    )


def state_of(instance_id: int) -> str:
    return Instance.objects.values_list("state", flat=True).get(pk=instance_id)
