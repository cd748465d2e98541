"""billing.selectors.ledger_problems: the cheap ledger check behind the metrics gauge names
each invariant a bug in holds or metering would break, and finds nothing in a sound ledger.
(An account below zero is refused by the database's own check constraint, so that branch
guards against a constraint dropped by mistake and cannot be reached here.)"""

from __future__ import annotations

from django.db.models import F

from billing.credits import credit_grant
from billing.holds import hold_create
from billing.models import Account, AccountKind, Hold
from billing.selectors import ledger_problems


def test_a_sound_ledger_has_no_problems_and_each_broken_invariant_is_named(
    renter_team, provider_team
):
    credit_grant(team_id=renter_team.pk, amount=5_000_000, reason="t", idempotency_key="lp-1")
    hold = hold_create(
        team_id=renter_team.pk, provider_team_id=provider_team.pk, amount=2_000_000,
        reference="rental:1", idempotency_key="lp-hold",
    )  # fmt: skip
    assert ledger_problems() == []

    # Money moved outside a transfer: the balances no longer sum to zero.
    Account.objects.filter(team=renter_team, kind=AccountKind.AVAILABLE).update(
        balance=F("balance") - 1
    )
    assert ledger_problems() == ["balances sum to -1 micro-dollars, not 0"]
    Account.objects.filter(team=renter_team, kind=AccountKind.AVAILABLE).update(
        balance=F("balance") + 1
    )

    # A hold whose amount changed without its transfer: held account and holds disagree.
    Hold.objects.filter(pk=hold.pk).update(amount=F("amount") + 7)
    assert ledger_problems() == [f"team {renter_team.pk}: held account 2000000, open holds 2000007"]
    Hold.objects.filter(pk=hold.pk).update(amount=F("amount") - 7)
    assert ledger_problems() == []
