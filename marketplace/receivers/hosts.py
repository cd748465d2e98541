"""Subscribers to the hosts room's events: pause or resume charges, refresh offers, push."""

from __future__ import annotations

from datetime import datetime

from django.dispatch import receiver

from core.task_queue import task_queue
from hosts.models import in_service
from hosts.selectors import register_occupancy
from hosts.services import register_commitments
from hosts.signals import machine_changed, machine_status_changed
from marketplace.events import publish_team_event
from marketplace.models import Rental
from marketplace.rentals.clocks import rentals_follow_machine
from marketplace.rentals.volume_metering import volumes_follow_machine
from marketplace.rentals.volumes import volumes_pending_removal
from marketplace.services.offers import offer_refresh
from scheduler.services import live_gpu_allocations, machine_instances_unknown, sliced_gpu_ids
from scheduler.tasks import machine_reconcile_one


@receiver(machine_status_changed, dispatch_uid="marketplace.machine_status_changed")
def on_machine_status_changed(sender, *, machine_id, team_id, old, new, reason, **kwargs):
    if in_service(old) != in_service(new):
        # A machine out of service (offline, Docker not answering, a changed host key, an
        # error: commands cannot reach it or it cannot run them) stops being charged until it
        # is online again, and what its containers do is unknown until then.
        if not in_service(new):
            machine_instances_unknown(machine_id=machine_id, reason=reason)
        rentals_follow_machine(machine_id=machine_id)
        # Its volumes' storage too; volumes deleted while it was out are removed now.
        volumes_follow_machine(machine_id=machine_id)
        if in_service(new):
            for volume_id in volumes_pending_removal(machine_id=machine_id):
                task_queue("marketplace.tasks.volume_remove", volume_id)
            # Its unknown instances learn now, not at the next reconcile, what became of
            # their containers (those the host killed meanwhile start again).
            machine_reconcile_one.delay(machine_id)
    offer_refresh(machine_id=machine_id)
    publish_team_event(
        team_id, "machine.status", {"id": machine_id, "status": new, "reason": reason}
    )


@receiver(machine_changed, dispatch_uid="marketplace.machine_changed")
def on_machine_changed(sender, *, machine_id, team_id=None, what="", **kwargs):
    offer_refresh(machine_id=machine_id)
    # Heartbeats change only the reliability figure, every few seconds per machine: not
    # worth re-rendering every open console for.
    if team_id is not None and what != "heartbeat":
        publish_team_event(team_id, "machine.changed", {"id": machine_id, "what": what})


def rented_gpus(machine_ids: list[int]) -> dict[int, str]:
    """Which GPUs live allocations or slices hold, for the provider's occupancy grid (a card
    with slices on it earns and takes no whole rental: it counts as rented)."""
    taken = live_gpu_allocations().filter(gpu__machine_id__in=machine_ids)
    rented = dict.fromkeys(taken.values_list("gpu_id", flat=True), "rented")
    rented.update(dict.fromkeys(sliced_gpu_ids(machine_ids), "rented"))
    return rented


register_occupancy(rented_gpus)


def rentals_end(machine_id: int) -> datetime | None:
    """The latest end date of the machine's rentals still open (the end date may not cut
    them short)."""
    return (
        Rental.objects.filter(machine_id=machine_id, settled_at=None)
        .order_by("-ends_at")
        .values_list("ends_at", flat=True)
        .first()
    )


register_commitments(rentals_end)
