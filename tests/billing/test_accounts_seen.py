"""A provider's earnings account is made, if missing, before a hold for their machine locks
anything; a process that has seen it committed does not look for it again (an account is
never deleted), and one whose making was rolled back is looked for, and made, again."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from billing.credits import credit_grant
from billing.holds import hold_create
from billing.models import Account, AccountKind
from tests.factories import TeamFactory

# Committed for real: what a process remembers is what a commit made durable.
pytestmark = pytest.mark.django_db(transaction=True)

USD = 1_000_000


def hold(renter, provider, key: str):
    return hold_create(
        team_id=renter.pk, provider_team_id=provider.pk, amount=USD, reference=f"rental:{key}",
        idempotency_key=f"hold-{key}",
    )  # fmt: skip


def earnings_statements(queries) -> list[str]:
    """The statements that looked for or made an earnings account."""
    return [
        query["sql"].split()[0]
        for query in queries.captured_queries
        if '"billing_account"' in query["sql"] and AccountKind.EARNINGS.value in query["sql"]
    ]


def test_a_second_hold_for_a_provider_does_not_look_for_their_earnings_account_again():
    renter, provider = TeamFactory(), TeamFactory()
    credit_grant(team_id=renter.pk, amount=10 * USD, reason="test", idempotency_key="fund")

    with CaptureQueriesContext(connection) as first:
        hold(renter, provider, "1")
    with CaptureQueriesContext(connection) as second:
        hold(renter, provider, "2")

    assert earnings_statements(first) == ["SELECT", "INSERT"]  # looked for, made
    assert earnings_statements(second) == []
    assert Account.objects.filter(team=provider, kind=AccountKind.EARNINGS).count() == 1


def test_an_earnings_account_made_in_a_rolled_back_transaction_is_made_again():
    renter, provider = TeamFactory(), TeamFactory()
    credit_grant(team_id=renter.pk, amount=10 * USD, reason="test", idempotency_key="fund")

    with pytest.raises(RuntimeError), transaction.atomic():
        hold(renter, provider, "1")
        raise RuntimeError("the rent fails after its hold")
    assert not Account.objects.filter(team=provider, kind=AccountKind.EARNINGS).exists()

    with CaptureQueriesContext(connection) as again:
        hold(renter, provider, "2")

    assert earnings_statements(again) == ["SELECT", "INSERT"]
    assert Account.objects.filter(team=provider, kind=AccountKind.EARNINGS).count() == 1
