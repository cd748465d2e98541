"""Thin tasks: take ids, reload, return early if there is nothing to do, call a service.

Every task is safe to run twice (a redelivery after a worker died, a duplicate enqueue).
Services queue them by name (``core.task_queue``), never by importing this module, which
imports them. Deployments' and clusters' tasks live beside them (``deployments/tasks.py``,
``clusters/tasks.py``), under the names they were always queued by.
"""

from __future__ import annotations

import logging

import structlog
from celery import shared_task

from marketplace.models import Volume
from marketplace.rentals import actions as renter_actions
from marketplace.rentals import bids, clocks, metering, volume_metering, volumes
from marketplace.services import env_vars, offers, registries, ssh_keys
from marketplace.services.accounts import invitations_expire as expire
from scheduler import services as scheduler
from scheduler import work as scheduler_work
from scheduler.models import WORK_STATES, Instance, InstanceState
from scheduler.work import register_fan_out, register_worker, work_enqueue

logger = logging.getLogger(__name__)


@shared_task(name="marketplace.tasks.invitations_expire")
def invitations_expire() -> int:
    return expire()


def _then(task, instance_id: int, outcome: scheduler.WorkOutcome, state: str) -> str:
    """After a launch, stop or destroy: try again later when the lease was busy or the host
    did not answer; hand over at once to the work the instance is due for now (a stop or
    destroy asked for while it launched)."""
    if outcome.state in ("busy", "retry"):
        # Eager runs (tests) do not wait: the work sweep or the test tries again.
        if not task.request.is_eager:
            work_enqueue(instance_id, state, countdown=outcome.retry_after)
        return outcome.state
    if outcome.state in WORK_STATES and outcome.state != state:
        work_enqueue(instance_id, outcome.state)
    return outcome.state


def _rental_context(instance_id: int, team_id: int | None):
    """Log lines of the task, and of the SSH commands it runs, name the rental and its team
    (marketplace/observability/logs.py); unbound again after it, as an eager run shares the
    request's context."""
    return structlog.contextvars.bound_contextvars(instance_id=instance_id, team_id=team_id)


@shared_task(name="marketplace.tasks.rental_launch", bind=True)
def rental_launch(self, instance_id: int) -> str:
    # What the launch needs before its lease; the launch reads the instance again under it.
    instance = (
        Instance.objects.filter(pk=instance_id)
        .only("team_id", "machine_id", "registry_credential")
        .first()
    )
    if instance is None:
        return "gone"
    with _rental_context(instance_id, instance.team_id):
        try:
            credentials = registries.registry_credentials(instance)
        except registries.RegistryLoginUnreadable as error:
            outcome = scheduler.instance_launch_fail(
                instance_id=instance_id, reason=f"Launch refused: {error}"
            )
            return _then(self, instance_id, outcome, InstanceState.LAUNCHING)
        logger.info("launching instance %s on machine %s", instance_id, instance.machine_id)
        outcome = scheduler.instance_launch(
            instance_id=instance_id,
            ssh_keys=lambda: ssh_keys.team_ssh_public_keys(instance.team_id),
            registry_credentials=credentials,
            team_env=lambda: env_vars.team_launch_env(instance.team_id),
        )
        logger.info("launch of instance %s: %s", instance_id, outcome.state)
        return _then(self, instance_id, outcome, InstanceState.LAUNCHING)


@shared_task(name="marketplace.tasks.rental_stop", bind=True)
def rental_stop(self, instance_id: int) -> str:
    team_id = Instance.objects.filter(pk=instance_id).values_list("team_id", flat=True).first()
    if team_id is None:
        return "gone"
    with _rental_context(instance_id, team_id):
        outcome = scheduler.instance_stop(instance_id=instance_id)
        return _then(self, instance_id, outcome, InstanceState.STOPPING)


@shared_task(name="marketplace.tasks.rental_destroy", bind=True)
def rental_destroy(self, instance_id: int) -> str:
    team_id = Instance.objects.filter(pk=instance_id).values_list("team_id", flat=True).first()
    if team_id is None:
        return "gone"
    with _rental_context(instance_id, team_id):
        outcome = scheduler.instance_destroy(instance_id=instance_id)
        return _then(self, instance_id, outcome, InstanceState.DESTROYING)


@shared_task(name="marketplace.tasks.rental_resume")
def rental_resume(instance_id: int) -> str:
    """An interrupted rental won its GPUs back: start it on them."""
    instance = bids.interrupted_rental_resume(instance_id=instance_id)
    return instance.state if instance is not None else "waiting"


@shared_task(name="marketplace.tasks.bids_resolve")
def bids_resolve() -> int:
    """Interrupted rentals whose GPUs came free (a safety net: freeing GPUs resolves at once)."""
    return bids.machines_bids_resolve()


def _queue(task):
    return lambda instance_id, countdown: task.apply_async((instance_id,), countdown=countdown)


register_worker(InstanceState.LAUNCHING, _queue(rental_launch))
register_worker(InstanceState.STOPPING, _queue(rental_stop))
register_worker(InstanceState.DESTROYING, _queue(rental_destroy))


@shared_task(name="marketplace.tasks.work_fan_out")
def work_fan_out(state: str, work: list[list]) -> int:
    """Queue each instance's task of a batch queued as one message (scheduler.work's
    ``work_enqueue_many``): [instance id, log context or None] each."""
    scheduler_work.work_fan_out(state, work)
    return len(work)


register_fan_out(lambda state, work: work_fan_out.apply_async((state, work)))


@shared_task(name="marketplace.tasks.metering_sweep")
def metering_sweep() -> int:
    # First whatever a lost state-change event left out of step (an ended rental unsettled,
    # a clock running for a stopped instance), so the sweep never charges for it.
    clocks.rentals_resync()
    return metering.metering_sweep() + volume_metering.volumes_meter_sweep()


@shared_task(name="marketplace.tasks.expiry_sweep")
def expiry_sweep() -> int:
    """Stop rentals whose time is up; delete the data of those past the grace period.

    Each instance is its own attempt: one machine that cannot be reached, or that presents a
    changed host key, is logged and retried on the next sweep, never stopping the others.
    """
    done = 0
    for instance_id in list(clocks.rentals_due_to_expire()):
        try:
            if scheduler.instance_expire(instance_id=instance_id) is not None:
                done += 1
        except Exception:
            logger.exception(
                "could not expire instance %s; the next sweep tries again", instance_id
            )
    for instance_id in list(clocks.rentals_due_for_data_deletion()):
        try:
            renter_actions.rental_destroy_request(
                instance=Instance.objects.get(pk=instance_id),
                reason="Data deleted after the grace period",
            )
        except Exception:
            logger.exception("could not delete the data of instance %s", instance_id)
    for volume_id in volumes.volumes_due_for_deletion():
        try:
            volumes.volume_delete(volume=Volume.objects.get(pk=volume_id))
        except Exception:
            logger.exception("could not delete volume %s; the next sweep tries again", volume_id)
    # Deleted volumes whose removal on the host has not happened yet (it failed, or the
    # machine was out of service and no event brought it back).
    for volume_id in volumes.volumes_pending_removal():
        volumes.volume_remove_on_host(volume_id=volume_id)
    # Volumes whose making on the host has not happened yet (the host was silent), and
    # resizes a dead worker left half done.
    for volume_id in volumes.volumes_still_creating():
        try:
            volumes.volume_create_on_host(volume_id=volume_id)
        except Exception:
            logger.exception("could not make volume %s; the next sweep tries again", volume_id)
    volumes.volumes_resize_finish()
    return done


@shared_task(name="marketplace.tasks.volume_build")
def volume_build(volume_id: int) -> str:
    """Make a volume on its host (queued when it is created)."""
    return volumes.volume_create_on_host(volume_id=volume_id)


@shared_task(name="marketplace.tasks.volume_remove")
def volume_remove(volume_id: int) -> bool:
    """Remove a deleted volume on its host (queued when it is deleted, and when its machine
    comes back into service)."""
    return volumes.volume_remove_on_host(volume_id=volume_id)


@shared_task(name="marketplace.tasks.offers_refresh")
def offers_refresh() -> int:
    return offers.offers_refresh_all()
