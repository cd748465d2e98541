"""Races on real PostgreSQL with real threads (each thread has its own connection)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from billing.credits import credit_grant
from billing.errors import InsufficientCredit
from billing.holds import hold_capture_usage, hold_create, hold_release
from billing.metering import HoldUsage, holds_settle_usage
from billing.models import Hold, Transfer
from billing.selectors import team_balance
from tests.billing.ledger_checks import assert_ledger_consistent
from tests.factories import TeamFactory

USD = 1_000_000


def race(functions):
    """Run the functions at the same moment in threads; return what each returned or raised."""
    barrier = threading.Barrier(len(functions))
    results: list[object] = [None] * len(functions)

    def run(index, function):
        try:
            barrier.wait(timeout=10)
            results[index] = function()
        except Exception as error:  # noqa: BLE001 - the test inspects it
            results[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(functions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return results


@pytest.mark.django_db(transaction=True)
def test_two_holds_racing_for_credit_that_covers_one():
    renter, provider = TeamFactory(), TeamFactory()
    credit_grant(team_id=renter.id, amount=10 * USD, reason="t", idempotency_key="race")

    def hold(n):
        return lambda: hold_create(
            team_id=renter.id,
            provider_team_id=provider.id,
            amount=6 * USD,
            reference=f"rental:{n}",
            idempotency_key=f"race-{n}",
        )

    results = race([hold(1), hold(2)])
    assert sum(isinstance(r, Hold) for r in results) == 1
    assert sum(isinstance(r, InsufficientCredit) for r in results) == 1
    assert team_balance(renter.id) == (4 * USD, 6 * USD)
    assert Hold.objects.count() == 1
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
def test_many_holds_racing_never_overdraw():
    renter, provider = TeamFactory(), TeamFactory()
    credit_grant(team_id=renter.id, amount=5 * USD, reason="t", idempotency_key="race")
    results = race(
        [
            (lambda n=n: hold_create(
                team_id=renter.id, provider_team_id=provider.id, amount=USD,
                reference=f"rental:{n}", idempotency_key=f"many-{n}",
            ))
            for n in range(8)
        ]
    )  # fmt: skip
    assert sum(isinstance(r, Hold) for r in results) == 5
    assert team_balance(renter.id) == (0, 5 * USD)
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
def test_the_same_hold_requested_twice_at_once_is_made_once():
    renter, provider = TeamFactory(), TeamFactory()
    credit_grant(team_id=renter.id, amount=10 * USD, reason="t", idempotency_key="twin")

    def twin():
        return hold_create(
            team_id=renter.id, provider_team_id=provider.id, amount=3 * USD,
            reference="rental:1", idempotency_key="same-key",
        )  # fmt: skip

    results = race([twin, twin, twin])
    assert all(isinstance(r, Hold) for r in results), results
    assert len({r.pk for r in results}) == 1
    assert team_balance(renter.id) == (7 * USD, 3 * USD)
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
def test_concurrent_captures_and_release_of_one_hold_stay_within_it():
    renter, provider = TeamFactory(), TeamFactory()
    credit_grant(team_id=renter.id, amount=10 * USD, reason="t", idempotency_key="cap")
    hold = hold_create(
        team_id=renter.id, provider_team_id=provider.id, amount=4 * USD,
        reference="rental:1", idempotency_key="cap-hold",
    )  # fmt: skip
    results = race(
        [lambda: hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=3 * USD)] * 3
        + [lambda: holds_settle_usage([HoldUsage(hold.pk, 3 * USD, 0)])] * 2
    )
    assert sorted(results) == [0, 0, 0, 0, 3 * USD]
    assert hold_release(hold_id=hold.pk) == USD
    assert Transfer.objects.filter(hold=hold, kind="capture").count() == 1
    assert_ledger_consistent()
