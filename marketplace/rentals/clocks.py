"""A rental's metering clocks follow its instance and its machine; an ended rental settles.

Every follower reads the current state rather than an event's, so events handled late, twice
or out of order leave the same result, and ``rentals_resync`` repairs what a lost event left.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing import holds
from hosts.models import Machine, MachineStatus, in_service
from marketplace.models import Rental
from marketplace.rentals.metering import rental_meter
from scheduler.models import Instance, InstanceState

logger = logging.getLogger(__name__)


# A paused instance keeps its GPUs (nobody else can rent them), so they stay charged.
GPU_CLOCK_STATES = {InstanceState.RUNNING, InstanceState.PAUSED, InstanceState.EXITED}
# The rental has ended: its period ran out, it failed (its launch failed or its container
# vanished: nothing is left to run or store), or its destruction was asked for. It settles then:
# what was used is captured and the rest of the hold goes back at once.
ENDED_STATES = {
    InstanceState.FAILED,
    InstanceState.EXPIRED,
    InstanceState.DESTROYING,
    InstanceState.DESTROYED,
}
# Ended rentals whose leftovers (data, a container) are deleted after the grace period.
GRACE_STATES = {InstanceState.EXPIRED, InstanceState.FAILED}


def data_grace() -> timedelta:
    """How long an expired rental's data is kept before it is deleted (DATA_GRACE_HOURS)."""
    return timedelta(hours=getattr(settings, "DATA_GRACE_HOURS", 48))


def _clock_start(since: datetime | None, now: datetime) -> datetime:
    return since or now


def _gpu_clock_stop(rental: Rental, now: datetime) -> None:
    """Bank the GPU clock's running time (never past the rental's end) and stop it."""
    rental.gpu_seconds = rental.gpu_seconds_at(now)
    rental.gpu_clock_since = None


def _storage_clock_stop(rental: Rental, now: datetime) -> None:
    rental.storage_seconds = rental.storage_seconds_at(now)
    rental.storage_clock_since = None


# What ``_clocks_follow`` changes.
CLOCK_FIELDS = ["gpu_seconds", "gpu_clock_since", "storage_seconds", "storage_clock_since"]


def _clocks_follow(
    rental: Rental, *, state: str, state_since: datetime, online: bool, now: datetime
) -> None:
    """The metering rule: GPU time runs while the instance holds its GPUs and runs (or exited
    on its own) on a machine in service; storage time runs until the rental ends, while the
    machine is in service. A clock already running keeps its start.

    A clock the instance's state stops is stopped when the instance entered that state
    (``state_since``), however late this runs; one the machine stops, now.
    """
    state_stop = min(state_since, now)
    if state not in GPU_CLOCK_STATES:
        _gpu_clock_stop(rental, state_stop)
    elif online:
        rental.gpu_clock_since = _clock_start(rental.gpu_clock_since, now)
    else:
        _gpu_clock_stop(rental, now)
    if state in ENDED_STATES:
        _storage_clock_stop(rental, state_stop)
    elif online:
        rental.storage_clock_since = _clock_start(rental.storage_clock_since, now)
    else:
        _storage_clock_stop(rental, now)


def _machine_in_service(machine_id: int) -> bool:
    return in_service(Machine.objects.values_list("status", flat=True).get(pk=machine_id))


def rental_follow_instance(*, instance_id: int) -> Rental | None:
    """Put the rental's clocks in step with its instance and machine as they are now, meter,
    and settle once the rental has ended (capture the usage, release the rest of the hold).

    It reads the current state rather than trusting an event's, so events handled late, twice
    or out of order all leave the same result, and ``rentals_resync`` can call it for any
    rental at any time.
    """
    with transaction.atomic():
        rental = (
            Rental.objects.select_for_update(of=("self",)).filter(instance_id=instance_id).first()
        )
        if rental is None or rental.settled_at is not None:
            return rental
        # The hold is locked before the clock is read: a metering sweep that is capturing
        # this hold finishes first, so it never counts time past ``now``.
        hold = holds.hold_lock(hold_id=rental.hold_id)
        now = timezone.now()
        # The instance and its machine (the rental's: an instance never moves) as they are.
        state, state_since, machine_status = Instance.objects.values_list(
            "state", "state_changed_at", "machine__status"
        ).get(pk=instance_id)
        ended = state in ENDED_STATES
        if ended:
            # It captures and then releases: every account either touches is locked first, in
            # one round, so it never holds one while waiting for another (see billing). A
            # rental going on at most captures, which locks its accounts in one round itself.
            holds.hold_settle_accounts_lock(hold)
        online = in_service(machine_status)
        _clocks_follow(rental, state=state, state_since=state_since, online=online, now=now)
        rental.save(update_fields=CLOCK_FIELDS)
        rental_meter(rental=rental, now=now, hold=hold)
        if ended:
            holds.hold_release(hold_id=rental.hold_id)
            rental.settled_at = now
            if state in GRACE_STATES:
                rental.data_delete_after = now + data_grace()
            rental.save(update_fields=["settled_at", "data_delete_after"])
    return rental


def rentals_follow_machine(*, machine_id: int) -> int:
    """The machine left service (stop its rentals' clocks) or came back (restart them), as
    its status is now: status events handled late or out of order end the same way.

    Only the clocks change here; the next metering sweep captures. Capturing here would lock
    one hold after another while holding the platform's revenue account, which a sweep
    batch holding the next of those holds could be waiting for.
    """
    now = timezone.now()
    changed = 0
    with transaction.atomic():
        rentals = list(
            Rental.objects.select_for_update(of=("self",))
            .filter(machine_id=machine_id, settled_at=None)
            .order_by("pk")
        )
        online = _machine_in_service(machine_id)  # read after the locks: the latest status
        instances = Instance.objects.filter(pk__in=[c.instance_id for c in rentals])
        states = {pk: (state, since) for pk, state, since in instances.values_list(
            "pk", "state", "state_changed_at"
        )}  # fmt: skip
        for rental in rentals:
            state, state_since = states[rental.instance_id]
            _clocks_follow(rental, state=state, state_since=state_since, online=online, now=now)
            rental.save()
            changed += 1
    return changed


def rentals_out_of_step():
    """Instance ids of open rentals that ``rental_follow_instance`` would change: clocks
    that disagree with the instance and the machine, or a rental that ended unsettled.

    Normally none: every state change is followed at once. What is left is what a lost event
    leaves (a worker killed between a change and its handler, a handler that failed).
    """
    online = Q(machine__status=MachineStatus.ONLINE)
    gpu_should_run = online & Q(instance__state__in=GPU_CLOCK_STATES)
    storage_should_run = online & ~Q(instance__state__in=ENDED_STATES)
    return (
        Rental.objects.filter(settled_at=None)
        .filter(
            Q(instance__state__in=ENDED_STATES)
            | (gpu_should_run & Q(gpu_clock_since=None))
            | (~gpu_should_run & Q(gpu_clock_since__isnull=False))
            | (storage_should_run & Q(storage_clock_since=None))
            | (~storage_should_run & Q(storage_clock_since__isnull=False))
        )
        .values_list("instance_id", flat=True)
    )


def rentals_resync() -> int:
    """Follow every rental that is out of step; return how many were. One that fails is
    logged and left for the next run, never stopping the others."""
    done = 0
    for instance_id in list(rentals_out_of_step()):
        try:
            rental_follow_instance(instance_id=instance_id)
            done += 1
        except Exception:
            logger.exception("could not bring the rental of instance %s in step", instance_id)
    return done


def rentals_due_to_expire(now: datetime | None = None):
    now = now or timezone.now()
    return Rental.objects.filter(settled_at=None, ends_at__lte=now).values_list(
        "instance_id", flat=True
    )


def rentals_due_for_data_deletion(now: datetime | None = None):
    now = now or timezone.now()
    return Rental.objects.filter(
        data_delete_after__lte=now, instance__state__in=GRACE_STATES
    ).values_list("instance_id", flat=True)
