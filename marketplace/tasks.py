"""Thin tasks: take ids, reload, return early if there is nothing to do, call a service.

Every task is safe to run twice (a redelivery after a worker died, a duplicate enqueue).
"""

from __future__ import annotations

import logging

from celery import shared_task

from hosts.runtime import HostKeyMismatch, HostUnreachable
from marketplace.services import rentals
from marketplace.services.tenancy import invitations_expire as expire
from scheduler import services as scheduler
from scheduler.models import Instance, InstanceState

logger = logging.getLogger(__name__)


@shared_task(name="marketplace.tasks.invitations_expire")
def invitations_expire() -> int:
    return expire()


@shared_task(
    name="marketplace.tasks.rental_launch",
    bind=True,
    autoretry_for=(HostUnreachable,),
    retry_backoff=5,
    retry_backoff_max=120,
    max_retries=8,
)
def rental_launch(self, instance_id: int) -> str:
    instance = Instance.objects.filter(pk=instance_id).first()
    if instance is None:
        return "gone"
    try:
        outcome = scheduler.instance_launch(
            instance_id=instance_id,
            ssh_keys=rentals.team_ssh_public_keys(instance.team_id),
            registry_credentials=rentals.registry_credentials(instance),
        )
    except HostKeyMismatch as error:
        scheduler.instance_transition(
            instance_id=instance_id,
            to_state=InstanceState.FAILED,
            reason=f"Launch refused: {error}",
            only_from={InstanceState.LAUNCHING},
        )
        return "failed"
    if outcome.state == "busy" and not self.request.is_eager:
        # Another worker holds the launch. Look again when its claim would run out: by then
        # it has finished (and this finds nothing to do) or died (and this takes over).
        raise self.retry(countdown=outcome.retry_after, max_retries=None)
    return outcome.state


@shared_task(name="marketplace.tasks.rental_stop")
def rental_stop(instance_id: int) -> str:
    instance = Instance.objects.filter(pk=instance_id).first()
    if instance is None or instance.state in (InstanceState.STOPPED, InstanceState.DESTROYED):
        return "nothing to do"
    return scheduler.instance_stop(instance_id=instance_id).state


@shared_task(
    name="marketplace.tasks.rental_destroy",
    autoretry_for=(HostUnreachable,),
    max_retries=5,
    retry_backoff=10,
)
def rental_destroy(instance_id: int, reason: str = "Destroyed by the renter") -> str:
    instance = Instance.objects.filter(pk=instance_id).first()
    if instance is None or instance.state == InstanceState.DESTROYED:
        return "nothing to do"
    return scheduler.instance_destroy(instance_id=instance_id, reason=reason).state


@shared_task(name="marketplace.tasks.metering_sweep")
def metering_sweep() -> int:
    # First whatever a lost state-change event left out of step (an ended rental unsettled,
    # a clock running for a stopped instance), so the sweep never charges for it.
    rentals.contracts_resync()
    return rentals.metering_sweep()


@shared_task(name="marketplace.tasks.expiry_sweep")
def expiry_sweep() -> int:
    """Stop rentals whose time is up; delete the data of those past the grace period.

    Each instance is its own attempt: one machine that cannot be reached, or that presents a
    changed host key, is logged and retried on the next sweep, never stopping the others.
    """
    done = 0
    for instance_id in list(rentals.contracts_due_to_expire()):
        try:
            if scheduler.instance_expire(instance_id=instance_id) is not None:
                done += 1
        except Exception:
            logger.exception(
                "could not expire instance %s; the next sweep tries again", instance_id
            )
    for instance_id in list(rentals.contracts_due_for_data_deletion()):
        try:
            rental_destroy.delay(instance_id, "Data deleted after the grace period")
        except Exception:
            logger.exception("could not delete the data of instance %s", instance_id)
    return done


@shared_task(name="marketplace.tasks.offers_refresh")
def offers_refresh() -> int:
    return rentals.offers_refresh_all()
