"""The console's low-balance notice: shown when available credit would not cover extending one
of the team's rentals by an hour: what extending it would hold, its GPUs and its storage (a
stopped rental too: it may start again within its period)."""

from __future__ import annotations

import pytest

from billing.credits import credit_grant
from billing.errors import InsufficientCredit
from marketplace.selectors import low_balance_notice, rental_extension_costs
from tests.conftest import client_for
from tests.factories import UserFactory, add_member

pytestmark = pytest.mark.django_db

USD = 1_000_000
STORAGE_HOUR = 4167  # 20 GB at $0.15/GB-month for an hour, rounded once
GPU_HOUR = 600_000


def give(team, amount: int, key: str) -> None:
    credit_grant(team_id=team.pk, amount=amount, reason="t", idempotency_key=key)


def test_each_rental_is_checked_on_its_own(rent, renter_team):
    small = rent(gpus=1)
    large = rent(gpus=4)
    stopped = rent(gpus=8, state="stopped")
    costs = {c.instance_id: c.cost for c in rental_extension_costs(renter_team.pk)}
    assert costs == {
        small.instance_id: GPU_HOUR + STORAGE_HOUR,
        large.instance_id: 4 * GPU_HOUR + STORAGE_HOUR,
        stopped.instance_id: 8 * GPU_HOUR + STORAGE_HOUR,  # as extending it would hold
    }

    # $3 covers another hour of the small and the large rental but not the stopped one,
    # although it is far less than all three together would want.
    give(renter_team, 3 * USD, "three")
    notice = low_balance_notice(renter_team.pk)
    assert notice == (
        f"Low balance: $3.00 available, and another hour of instance {stopped.instance_id} on "
        f"machine {rent.machine.pk} needs $4.804167 (GPUs and storage). "
        "Top up so you can extend it."
    )

    give(renter_team, 2 * USD, "two")  # $5 covers each rental's next hour on its own
    assert low_balance_notice(renter_team.pk) is None


def test_several_short_rentals_are_counted_and_the_dearest_named(rent, renter_team):
    rent(gpus=1)
    large = rent(gpus=4)
    give(renter_team, USD // 2, "half")
    assert low_balance_notice(renter_team.pk) == (
        "Low balance: $0.50 available, not enough to extend 2 of your rentals by an hour "
        f"(instance {large.instance_id} needs the most: $2.404167, GPUs and storage). "
        "Top up so you can extend them."
    )


def test_the_notice_agrees_with_extending_a_stopped_rental(rent, renter_team):
    """No notice means an hour's extension goes through; a notice means it would be refused."""
    from marketplace.rentals.extending import rental_extend

    stopped = rent(gpus=8, state="stopped", hold=10 * USD)
    give(renter_team, STORAGE_HOUR, "storage")  # its storage alone does not extend it
    assert f"instance {stopped.instance_id}" in low_balance_notice(renter_team.pk)
    with pytest.raises(InsufficientCredit):
        rental_extend(rental=stopped, hours=1)
    give(renter_team, 8 * GPU_HOUR, "gpus")
    assert low_balance_notice(renter_team.pk) is None
    rental_extend(rental=stopped, hours=1)


def test_no_notice_without_live_rentals(rent, renter_team):
    assert low_balance_notice(renter_team.pk) is None  # nothing to extend, even at $0
    rent(gpus=2, settled_at=rent.now)
    assert low_balance_notice(renter_team.pk) is None


def test_the_console_shows_the_notice_until_credit_covers_it(client, rent, renter_team):
    member = UserFactory(username="renter")
    add_member(renter_team, member, "owner")
    large = rent(gpus=4)
    html = client_for(client, member, renter_team).get("/billing/").content.decode()
    assert 'id="low-balance"' in html and "Top up" in html
    assert f"another hour of instance {large.instance_id}" in html
    give(renter_team, 3 * USD, "enough")
    assert 'id="low-balance"' not in client.get("/billing/").content.decode()
