"""Rentals stay in step with their instance and machine even when a state-change event is
lost, late or out of order, and a rental's end never deadlocks with renting.

A lost event is what a worker killed between an instance's change and its handler leaves: the
instance's new state committed, the rental's clocks as they were. The tests write exactly that
state, then run what a worker runs.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

from billing.models import Account, AccountKind, Hold, HoldStatus
from billing.selectors import team_balance
from hosts.models import Machine
from marketplace import tasks
from marketplace.models import Rental
from marketplace.rentals.clocks import rental_follow_instance, rentals_follow_machine
from marketplace.rentals.metering import rental_owed
from scheduler.models import Instance
from tests.billing.databases import postgresql_only
from tests.billing.ledger_checks import assert_ledger_consistent, ledger_counts

pytestmark = pytest.mark.django_db

HOLD = 100_000_000
PER_GPU_HOUR = 600_000  # the rent fixture's machine


def lose_event(rental: Rental, state: str, at) -> None:
    """The instance changed state at ``at``; the handler that follows the rental never ran."""
    Instance.objects.filter(pk=rental.instance_id).update(state=state, state_changed_at=at)


def clocks(rental: Rental) -> tuple[bool, bool]:
    rental.refresh_from_db()
    return rental.gpu_clock_since is not None, rental.storage_clock_since is not None


def test_a_rental_destroyed_without_its_settlement_is_settled_by_the_next_sweep(rent, renter_team):
    now = rent.now
    rental = rent(gpu_clock_since=now - timedelta(hours=1),
                    storage_clock_since=now - timedelta(hours=1))  # fmt: skip
    destroyed_at = now - timedelta(minutes=10)
    lose_event(rental, "destroyed", destroyed_at)

    tasks.metering_sweep()

    rental.refresh_from_db()
    hold = Hold.objects.get(pk=rental.hold_id)
    assert rental.settled_at is not None and hold.status == HoldStatus.RELEASED
    # Charged up to the destruction, not up to the sweep: 50 minutes of one GPU.
    assert hold.captured_gpu == 50 * 60 * PER_GPU_HOUR // 3600
    owed = rental_owed(rental, destroyed_at)
    assert (hold.captured_gpu, hold.captured_storage) == (owed.gpu, owed.storage)
    assert team_balance(renter_team.pk) == (HOLD - hold.captured, 0)
    before = ledger_counts()
    tasks.metering_sweep()  # and nothing more, ever
    assert ledger_counts() == before
    assert_ledger_consistent()


def test_an_instance_stopped_without_its_event_stops_costing_gpu_time_from_when_it_stopped(rent):
    now = rent.now
    rental = rent(gpu_clock_since=now - timedelta(hours=1),
                    storage_clock_since=now - timedelta(hours=1))  # fmt: skip
    lose_event(rental, "stopped", now - timedelta(minutes=30))

    tasks.metering_sweep()

    assert clocks(rental) == (False, True)  # storage still runs: the data is kept
    assert rental.gpu_seconds == 30 * 60
    assert rental.settled_at is None
    hold = Hold.objects.get(pk=rental.hold_id)
    assert hold.captured_gpu == 30 * 60 * PER_GPU_HOUR // 3600


def test_machine_events_handled_late_or_out_of_order_follow_the_machine_as_it_is(rent):
    now = rent.now
    rental = rent(gpu_clock_since=now - timedelta(hours=1),
                    storage_clock_since=now - timedelta(hours=1))  # fmt: skip
    machine = rent.machine
    Machine.objects.filter(pk=machine.pk).update(status="offline")
    rentals_follow_machine(machine_id=machine.pk)
    assert clocks(rental) == (False, False)
    frozen = (rental.gpu_seconds, rental.storage_seconds)
    assert frozen[0] >= 3600

    # Back online, and the handler of the old "offline" event runs only now: charges resume.
    Machine.objects.filter(pk=machine.pk).update(status="online")
    rentals_follow_machine(machine_id=machine.pk)
    rentals_follow_machine(machine_id=machine.pk)
    assert clocks(rental) == (True, True)
    assert (rental.gpu_seconds, rental.storage_seconds) == frozen  # the outage unbilled

    # Offline again, and this event is lost altogether: the next sweep pauses the charges.
    Machine.objects.filter(pk=machine.pk).update(status="offline")
    tasks.metering_sweep()
    assert clocks(rental) == (False, False)


def test_rentals_in_step_are_left_alone_by_the_sweep(rent):
    now = rent.now
    running = rent(gpu_clock_since=now - timedelta(hours=1),
                   storage_clock_since=now - timedelta(hours=1))  # fmt: skip
    stopped = rent(state="stopped", gpu_seconds=600, storage_clock_since=now - timedelta(hours=1))
    before = {c.pk: (c.gpu_clock_since, c.storage_clock_since) for c in (running, stopped)}
    tasks.metering_sweep()
    for rental in (running, stopped):
        rental.refresh_from_db()
        assert (rental.gpu_clock_since, rental.storage_clock_since) == before[rental.pk]
        assert rental.settled_at is None
    assert rental_follow_instance(instance_id=stopped.instance_id).gpu_seconds == 600


@postgresql_only("row locks and pg_stat_activity (SQLite locks the whole file, so no deadlock)")
@pytest.mark.django_db(transaction=True)
def test_a_rental_ending_while_the_renter_rents_again_does_not_deadlock(rent, renter_team):
    """Renting locks the renter's available account, then their held one. Settling a rental
    must never hold the held account while it waits for the available one."""
    now = rent.now
    rental = rent(gpu_clock_since=now - timedelta(hours=1),
                    storage_clock_since=now - timedelta(hours=1))  # fmt: skip
    lose_event(rental, "destroyed", now)
    accounts = Account.objects.filter(team=renter_team)
    settled: list[object] = []

    def settle():
        try:
            settled.append(rental_follow_instance(instance_id=rental.instance_id))
        except Exception as error:  # noqa: BLE001 - the test inspects it
            settled.append(error)
        finally:
            connection.close()

    with transaction.atomic():
        # As hold_create does: the available account first...
        accounts.select_for_update().get(kind=AccountKind.AVAILABLE)
        settling = threading.Thread(target=settle)
        settling.start()
        deadline = time.monotonic() + 10
        while not _someone_waits_for_a_lock():
            assert settling.is_alive(), settled
            assert time.monotonic() < deadline, "the settlement never reached the renter's accounts"
            time.sleep(0.05)
        # ...then the held one, while the settlement waits: it must be free.
        accounts.select_for_update(nowait=True).get(kind=AccountKind.HELD)
    settling.join(timeout=30)
    assert len(settled) == 1 and isinstance(settled[0], Rental), settled
    assert settled[0].settled_at is not None
    assert Hold.objects.get(pk=rental.hold_id).status == HoldStatus.RELEASED
    assert_ledger_consistent()


def _someone_waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else a transaction sees one snapshot
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0
