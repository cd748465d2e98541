"""Payout requests (billing/payouts.py): a provider asks, the operator pays or rejects in the
admin. Every step is a balanced ledger transfer; a refused one writes nothing; a retried one
writes nothing twice. Runs on PostgreSQL and, in the money job, on SQLite (scripts/test.sh)."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry

from billing import payouts
from billing.credits import credit_grant, payout_record
from billing.errors import (
    IdempotencyConflict,
    InsufficientEarnings,
    InvalidAmount,
    PayoutConflict,
    PayoutNotFound,
)
from billing.holds import hold_capture_usage, hold_create
from billing.models import Account, AccountKind, Entry, PayoutRequest, PayoutStatus, TransferKind
from billing.selectors import earnings_paid_out, ledger_problems, team_earnings_balance
from tests.billing.ledger_checks import assert_ledger_consistent, ledger_counts

pytestmark = pytest.mark.django_db

USD = 1_000_000


@pytest.fixture(autouse=True)
def minimum(settings):
    settings.BILLING_PAYOUT_MIN = 5 * USD
    return settings.BILLING_PAYOUT_MIN


@pytest.fixture
def earned(renter_team, provider_team):
    """The provider earned $36.00: a $40.00 charge less the 10% platform fee."""
    credit_grant(team_id=renter_team.pk, amount=50 * USD, reason="t", idempotency_key="e")
    hold = hold_create(
        team_id=renter_team.pk, provider_team_id=provider_team.pk, amount=45 * USD,
        reference="rental:1", idempotency_key="earned-hold", machine_reference="machine:1",
    )  # fmt: skip
    hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=40 * USD)
    assert team_earnings_balance(provider_team.pk) == 36 * USD
    return provider_team


def balances(team) -> dict[str, int]:
    return dict(Account.objects.filter(team=team).values_list("kind", "balance"))


def platform_payouts() -> int:
    account = Account.objects.filter(team=None, kind=AccountKind.PAYOUTS).first()
    return account.balance if account else 0


def test_a_request_moves_earnings_to_pending_and_approval_pays_it(earned):
    payout, created = payouts.payout_request_create(team_id=earned.pk, amount=20 * USD)
    assert created and payout.status == PayoutStatus.REQUESTED
    assert balances(earned)["earnings"] == 16 * USD
    assert balances(earned)["payout_pending"] == 20 * USD
    assert payout.request_transfer.kind == TransferKind.PAYOUT_REQUEST
    assert payout.request_transfer.reference == f"payout:{payout.pk}"
    assert_ledger_consistent()
    assert ledger_problems() == []

    paid = payouts.payout_approve(payout_id=payout.pk, note="wire #77", decided_by_id=None)
    assert (paid.status, paid.note) == (PayoutStatus.PAID, "wire #77")
    assert paid.decided_at is not None
    assert balances(earned) == {**balances(earned), "earnings": 16 * USD, "payout_pending": 0}
    assert platform_payouts() == 20 * USD
    assert earnings_paid_out(Entry.objects.filter(team=earned)) == 20 * USD
    assert_ledger_consistent()
    assert ledger_problems() == []

    # Approving again (a double click, a retried request) pays nothing more.
    before = ledger_counts()
    assert payouts.payout_approve(payout_id=payout.pk, decided_by_id=None).status == "paid"
    assert ledger_counts() == before
    with pytest.raises(PayoutConflict):
        payouts.payout_reject(payout_id=payout.pk, reason="too late", decided_by_id=None)
    assert ledger_counts() == before


def test_rejection_returns_all_of_it_to_earnings_with_the_reason(earned):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=36 * USD)
    assert balances(earned)["earnings"] == 0
    rejected = payouts.payout_reject(
        payout_id=payout.pk, reason="  Bank details missing ", decided_by_id=None
    )
    assert (rejected.status, rejected.reason) == (PayoutStatus.REJECTED, "Bank details missing")
    assert balances(earned)["earnings"] == 36 * USD and balances(earned)["payout_pending"] == 0
    assert rejected.decision_transfer.kind == TransferKind.PAYOUT_REJECT
    assert "Bank details missing" in rejected.decision_transfer.description
    assert platform_payouts() == 0
    assert_ledger_consistent()

    before = ledger_counts()
    payouts.payout_reject(payout_id=payout.pk, reason="again", decided_by_id=None)
    with pytest.raises(PayoutConflict):
        payouts.payout_approve(payout_id=payout.pk, decided_by_id=None)
    assert ledger_counts() == before
    # Decided: the next request may be asked.
    again, created = payouts.payout_request_create(team_id=earned.pk, amount=10 * USD)
    assert created and again.pk != payout.pk


@pytest.mark.parametrize(
    ("amount", "error", "field"),
    [
        (0, InvalidAmount, "amount"),
        (-5 * USD, InvalidAmount, "amount"),
        (4_990_000, InvalidAmount, "amount"),  # under the $5.00 minimum
        (10 * USD + 1, InvalidAmount, "amount"),  # not whole cents
        (36 * USD + 10_000, InsufficientEarnings, "amount"),  # a cent over the earnings
        (10**15, InsufficientEarnings, "amount"),
    ],
)
def test_bad_amounts_are_refused_naming_the_field_and_write_nothing(earned, amount, error, field):
    before = ledger_counts()
    with pytest.raises(error) as raised:
        payouts.payout_request_create(team_id=earned.pk, amount=amount)
    assert field in raised.value.fields
    assert ledger_counts() == before


def test_a_reason_is_required_to_reject(earned):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=10 * USD)
    before = ledger_counts()
    for reason in ("", "   ", "x" * 301):
        with pytest.raises(InvalidAmount) as raised:
            payouts.payout_reject(payout_id=payout.pk, reason=reason, decided_by_id=None)
        assert "reason" in raised.value.fields
    assert ledger_counts() == before


def test_one_request_waits_at_a_time_and_a_retry_by_key_returns_the_first(earned):
    first, created = payouts.payout_request_create(
        team_id=earned.pk, amount=10 * USD, idempotency_key="k1"
    )
    assert created
    before = ledger_counts()
    again, created = payouts.payout_request_create(
        team_id=earned.pk, amount=10 * USD, idempotency_key="k1"
    )
    assert (again.pk, created) == (first.pk, False)
    with pytest.raises(IdempotencyConflict) as conflict:
        payouts.payout_request_create(team_id=earned.pk, amount=11 * USD, idempotency_key="k1")
    assert "idempotency_key" in conflict.value.fields
    with pytest.raises(PayoutConflict) as waiting:
        payouts.payout_request_create(team_id=earned.pk, amount=5 * USD, idempotency_key="k2")
    assert "amount" in waiting.value.fields and "$10.00" in str(waiting.value)
    assert ledger_counts() == before


def test_the_operators_direct_payout_cannot_take_what_a_request_holds(earned):
    payouts.payout_request_create(team_id=earned.pk, amount=30 * USD)
    before = ledger_counts()
    with pytest.raises(InsufficientEarnings):
        payout_record(provider_team_id=earned.pk, amount=7 * USD, idempotency_key="d", note="n")
    assert ledger_counts() == before
    payout_record(provider_team_id=earned.pk, amount=6 * USD, idempotency_key="d", note="n")
    assert balances(earned)["earnings"] == 0
    assert_ledger_consistent()


# --- the operator's side, in the admin -----------------------------------------------------


@pytest.fixture
def operator(client):
    from marketplace.models import User

    user = User.objects.create_superuser("op", "op@example.com", "pw-for-tests-123")
    client.force_login(user)
    return user


def admin_url(payout: PayoutRequest) -> str:
    return f"/admin/billing/payoutrequest/{payout.pk}/change/"


def test_operator_pays_a_request_in_the_admin(client, operator, earned):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=12 * USD)
    listing = client.get("/admin/billing/payoutrequest/?status=requested").content.decode()
    assert admin_url(payout) in listing and "$12.00" in listing
    page = client.get(admin_url(payout)).content.decode()
    assert "Waiting for approval" in page and 'id="payout-decision-form"' in page

    response = client.post(admin_url(payout), {"decision": "approve", "note": "SEPA 2026-11-27"})
    assert response.status_code == 302
    payout.refresh_from_db()
    assert (payout.status, payout.note, payout.decided_by) == ("paid", "SEPA 2026-11-27", operator)
    assert payout.decision_transfer.created_by == operator
    assert LogEntry.objects.filter(object_id=str(payout.pk)).exists()
    # Decided: the page shows it and offers no form; a stale form posted again is refused.
    page = client.get(admin_url(payout)).content.decode()
    assert "Paid" in page and "payout-decision-form" not in page
    before = ledger_counts()
    assert client.post(admin_url(payout), {"decision": "reject", "reason": "x"}).status_code == 403
    assert ledger_counts() == before
    assert_ledger_consistent()


def test_operator_rejects_only_with_a_reason(client, operator, earned):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=12 * USD)
    before = ledger_counts()
    page = client.post(admin_url(payout), {"decision": "reject", "reason": " "})
    assert page.status_code == 200
    assert "Say why the payout is rejected" in page.content.decode()
    assert ledger_counts() == before

    response = client.post(admin_url(payout), {"decision": "reject", "reason": "Unverified KYC"})
    assert response.status_code == 302
    payout.refresh_from_db()
    assert (payout.status, payout.reason) == ("rejected", "Unverified KYC")
    assert balances(earned)["earnings"] == 36 * USD
    assert_ledger_consistent()


def test_the_admin_cannot_add_or_delete_requests(client, operator, earned):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=12 * USD)
    assert client.get("/admin/billing/payoutrequest/add/").status_code == 403
    assert client.get(f"/admin/billing/payoutrequest/{payout.pk}/delete/").status_code == 403


# --- Stripe Connect: the operator pays through Stripe (its servers: tests/billing/stripe_fakes)


@pytest.fixture
def connect(fake_stripe, settings, earned):
    from billing.models import PayoutDestination

    settings.STRIPE_CONNECT_PAYOUTS = True
    PayoutDestination.objects.create(team=earned, stripe_account_id="acct_1ProviderCo")
    return fake_stripe


def test_operator_pays_through_stripe_connect_once(client, operator, connect, earned):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=12_340_000)
    page = client.get(admin_url(payout)).content.decode()
    assert "Pay now through Stripe Connect, to acct_1ProviderCo" in page

    response = client.post(admin_url(payout), {"decision": "stripe"})
    assert response.status_code == 302
    [sent] = connect.requests
    assert sent["path"] == "/v1/transfers"
    assert sent["headers"]["idempotency-key"] == f"payout-{payout.pk}"
    form = sent["form"]
    assert (form["amount"], form["currency"], form["destination"]) == (
        "1234", "usd", "acct_1ProviderCo",
    )  # fmt: skip
    assert form["metadata[payout_request]"] == str(payout.pk)
    payout.refresh_from_db()
    assert (payout.status, payout.note) == ("paid", "Stripe transfer tr_test_local_1")
    assert platform_payouts() == 12_340_000
    assert_ledger_consistent()

    # Paid: paying again asks Stripe for nothing and writes nothing.
    before = ledger_counts()
    payouts.payout_pay_with_stripe(payout_id=payout.pk, decided_by_id=None)
    assert len(connect.requests) == 1 and ledger_counts() == before


def test_stripe_refusing_writes_nothing_and_the_request_still_waits(
    client, operator, connect, earned
):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=12 * USD)
    connect.status = 500
    before = ledger_counts()
    page = client.post(admin_url(payout), {"decision": "stripe"})
    assert page.status_code == 200 and "Stripe did not pay it" in page.content.decode()
    assert ledger_counts() == before
    payout.refresh_from_db()
    assert payout.status == "requested"


def test_without_connect_or_an_account_stripe_is_not_offered(client, operator, earned, settings):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=12 * USD)
    assert "Stripe Connect" not in client.get(admin_url(payout)).content.decode()
    before = ledger_counts()
    page = client.post(admin_url(payout), {"decision": "stripe"})
    assert page.status_code == 200  # not a choice: the form says so
    assert ledger_counts() == before


# --- races (real threads, each with its own connection) ------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_asks_at_once_make_one_request_and_approve_racing_reject_decides_once(earned):
    from tests.billing.test_concurrency import race

    def ask(key: str):
        return lambda: payouts.payout_request_create(
            team_id=earned.pk, amount=30 * USD, idempotency_key=key
        )

    results = race([ask("a"), ask("b")])
    assert sum(isinstance(r, tuple) for r in results) == 1, results
    assert sum(isinstance(r, PayoutConflict) for r in results) == 1, results
    payout = PayoutRequest.objects.get(team=earned)

    results = race(
        [
            lambda: payouts.payout_approve(payout_id=payout.pk, decided_by_id=None),
            lambda: payouts.payout_reject(payout_id=payout.pk, reason="no", decided_by_id=None),
        ]
    )
    assert sum(isinstance(r, PayoutRequest) for r in results) == 1, results
    assert sum(isinstance(r, PayoutConflict) for r in results) == 1, results
    payout.refresh_from_db()
    assert balances(earned)["payout_pending"] == 0
    expected = 6 * USD if payout.status == "paid" else 36 * USD
    assert balances(earned)["earnings"] == expected
    assert_ledger_consistent()


# --- the provider cancels its own waiting request ---------------------------------------------


@pytest.fixture
def provider(earned):
    from tests.factories import UserFactory, add_member

    user = UserFactory()
    add_member(earned, user, "admin")
    return user


def test_a_provider_cancels_its_waiting_request_and_the_earnings_come_back(earned, provider):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=20 * USD)
    cancelled = payouts.payout_cancel(
        team_id=earned.pk, payout_id=payout.pk, cancelled_by_id=provider.pk
    )
    assert cancelled.status == PayoutStatus.CANCELLED
    assert cancelled.decided_by_id == provider.pk and cancelled.decided_at is not None
    assert balances(earned)["earnings"] == 36 * USD and balances(earned)["payout_pending"] == 0
    assert cancelled.decision_transfer.kind == TransferKind.PAYOUT_CANCEL
    assert cancelled.decision_transfer.amount == 20 * USD
    assert platform_payouts() == 0
    assert_ledger_consistent()

    # Again: the same answer, nothing written. The operator can no longer decide it.
    before = ledger_counts()
    again = payouts.payout_cancel(team_id=earned.pk, payout_id=payout.pk, cancelled_by_id=None)
    assert again.status == PayoutStatus.CANCELLED and again.decided_by_id == provider.pk
    with pytest.raises(PayoutConflict, match="cancelled"):
        payouts.payout_approve(payout_id=payout.pk, decided_by_id=None)
    with pytest.raises(PayoutConflict, match="cancelled"):
        payouts.payout_reject(payout_id=payout.pk, reason="late", decided_by_id=None)
    assert ledger_counts() == before
    # The next one may be asked, for all of the earnings again.
    _, created = payouts.payout_request_create(team_id=earned.pk, amount=36 * USD)
    assert created


@pytest.mark.parametrize("decided", ["paid", "rejected"])
def test_a_decided_request_cannot_be_cancelled_and_nothing_is_written(earned, decided):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=10 * USD)
    if decided == "paid":
        payouts.payout_approve(payout_id=payout.pk, note="SEPA 1", decided_by_id=None)
    else:
        payouts.payout_reject(payout_id=payout.pk, reason="no", decided_by_id=None)
    before = ledger_counts()
    with pytest.raises(PayoutConflict) as refused:
        payouts.payout_cancel(team_id=earned.pk, payout_id=payout.pk, cancelled_by_id=None)
    assert refused.value.http_status == 409
    assert f"already {decided} by the operator" in str(refused.value)
    assert ledger_counts() == before


def test_another_teams_request_cannot_be_cancelled(earned, renter_team):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=10 * USD)
    before = ledger_counts()
    for payout_id in (payout.pk, payout.pk + 1000):
        with pytest.raises(PayoutNotFound) as refused:
            payouts.payout_cancel(team_id=renter_team.pk, payout_id=payout_id, cancelled_by_id=None)
        assert refused.value.http_status == 404
    assert ledger_counts() == before


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_approve_decides_once(earned):
    from tests.billing.test_concurrency import race

    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=30 * USD)
    results = race(
        [
            lambda: payouts.payout_approve(payout_id=payout.pk, decided_by_id=None),
            lambda: payouts.payout_cancel(
                team_id=earned.pk, payout_id=payout.pk, cancelled_by_id=None
            ),
        ]
    )
    assert sum(isinstance(r, PayoutRequest) for r in results) == 1, results
    assert sum(isinstance(r, PayoutConflict) for r in results) == 1, results
    payout.refresh_from_db()
    assert balances(earned)["payout_pending"] == 0
    expected = 6 * USD if payout.status == "paid" else 36 * USD
    assert balances(earned)["earnings"] == expected
    assert_ledger_consistent()
