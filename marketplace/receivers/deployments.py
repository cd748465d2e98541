"""Subscribers that wake the deployment reconciler: a replica's instance changed, or capacity
may have appeared or gone (an instance gave GPUs back, a machine changed status or listing).

The passes run after the change commits (the signals are sent on commit). A pass that changes
nothing sends no signal, so waking never feeds on itself. A pass places from the offers read
model, so the machine's offer is brought up to date first: the receiver that refreshes offers
may run after this one.
"""

from __future__ import annotations

from django.dispatch import receiver

from hosts.signals import machine_changed, machine_status_changed
from marketplace.deployments.reconciler import (
    deployment_wake,
    deployments_on_machine,
    deployments_waiting_for_capacity,
    deployments_wake_waiting,
)
from marketplace.models import Replica
from marketplace.services.offers import offer_refresh
from scheduler.models import GPU_HOLDING_STATES
from scheduler.signals import instance_state_changed


@receiver(instance_state_changed, dispatch_uid="marketplace.deployments.instance_state_changed")
def on_instance_state_changed(sender, *, instance_id, machine_id, to_state, **kwargs):
    own = set(
        Replica.objects.filter(instance_id=instance_id).values_list("deployment_id", flat=True)
    )
    # GPUs given back (the instance left the holding states, or a same-state event after its
    # container was seen stopped): queued replicas elsewhere may fit now.
    waiting = (
        set(deployments_waiting_for_capacity()) if to_state not in GPU_HOLDING_STATES else set()
    )
    _wake(own, waiting, machine_id)


@receiver(machine_status_changed, dispatch_uid="marketplace.deployments.machine_status_changed")
def on_machine_status_changed(sender, *, machine_id, **kwargs):
    # Offline: its replicas are replaced. Online again: queued replicas may fit there.
    _wake(
        set(deployments_on_machine(machine_id)), set(deployments_waiting_for_capacity()), machine_id
    )


@receiver(machine_changed, dispatch_uid="marketplace.deployments.machine_changed")
def on_machine_changed(sender, *, machine_id, what="", **kwargs):
    # A heartbeat only moves the reliability figure, every few seconds per machine: the sweep
    # picks that up.
    if what == "heartbeat":
        return
    _wake(set(), set(deployments_waiting_for_capacity()), machine_id)


def _wake(own: set[int], waiting: set[int], machine_id: int) -> None:
    """A pass each over the deployments the event is about (waiting for any pass under way,
    which may have read before the change); one pass over all those waiting for capacity."""
    waiting -= own
    if not (own or waiting):
        return
    offer_refresh(machine_id=machine_id)
    for deployment_id in sorted(own):
        deployment_wake(deployment_id)
    if waiting:
        deployments_wake_waiting(waiting)
