"""Subscribers to the scheduler's events: meter the rental and push the change to consoles."""

from __future__ import annotations

import logging

from django.dispatch import receiver

from hosts.models import Machine
from marketplace.events import publish_instance_event, publish_team_event
from marketplace.rentals.bids import bids_waiting, interrupted_note, machine_bids_resolve
from marketplace.rentals.clocks import rental_follow_instance
from marketplace.rentals.versions import rental_follow_version
from marketplace.services.offers import offer_refresh
from scheduler.models import GPU_HOLDING_STATES, InstanceState
from scheduler.signals import instance_progress, instance_state_changed

logger = logging.getLogger(__name__)


@receiver(instance_state_changed, dispatch_uid="marketplace.rental_follow_instance")
def on_instance_state_changed(
    sender,
    *,
    instance_id,
    team_id,
    machine_id,
    from_state,
    to_state,
    reason,
    launched_as_asked=False,
    **kwargs,
):
    if to_state == InstanceState.STOPPED:
        reason = interrupted_note(instance_id) or reason
    # The consoles first: nothing below changes what the event says, and each of it is a
    # transaction or a query the console's "running" would otherwise wait for.
    publish_instance_event(
        team_id,
        instance_id,
        "instance.state",
        {"id": instance_id, "state": to_state, "from": from_state, "reason": reason},
    )
    rental_follow_instance(instance_id=instance_id)
    if to_state == InstanceState.RUNNING and not launched_as_asked:
        # A failed version may have given way to the one before it (its GPUs, disk, volumes).
        try:
            rental_follow_version(instance_id=instance_id)
        except Exception:
            logger.exception("rental of instance %s did not follow its version", instance_id)
    if to_state not in GPU_HOLDING_STATES and bids_waiting(machine_id):
        # GPUs came free: an interrupted rental waiting for them may win them back now.
        machine_bids_resolve(machine_id=machine_id)
    # Also on a same-state event: it may be GPUs released once a container was seen stopped.
    if not launched_as_asked:
        offer_refresh(machine_id=machine_id)
    if to_state not in GPU_HOLDING_STATES:
        # GPUs may have come free: the provider's machine pages count them.
        provider = Machine.objects.filter(pk=machine_id).values_list("team_id", flat=True)
        for provider_team_id in provider:
            publish_team_event(
                provider_team_id, "machine.changed", {"id": machine_id, "what": "rentals"}
            )


@receiver(instance_progress, dispatch_uid="marketplace.instance_progress")
def on_instance_progress(sender, *, instance_id, team_id, progress, message, **kwargs):
    publish_instance_event(
        team_id,
        instance_id,
        "instance.progress",
        {"id": instance_id, "progress": progress, "message": message},
    )
