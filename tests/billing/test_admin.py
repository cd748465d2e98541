"""Operator actions in the admin, logged in as staff: payouts to providers, credit grants."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry

from billing.credits import credit_grant
from billing.holds import hold_capture_usage, hold_create
from billing.models import Account, AccountKind, Transfer
from billing.selectors import team_earnings_balance
from tests.billing.ledger_checks import assert_ledger_consistent, ledger_counts
from tests.conftest import client_for
from tests.factories import UserFactory, add_member

pytestmark = pytest.mark.django_db

USD = 1_000_000
PAYOUT_ADD = "/admin/billing/payout/add/"


@pytest.fixture
def earned(renter_team, provider_team):
    """The provider earned $9.00: a $10.00 charge less the 10% platform fee."""
    credit_grant(team_id=renter_team.pk, amount=50 * USD, reason="t", idempotency_key="e")
    hold = hold_create(
        team_id=renter_team.pk, provider_team_id=provider_team.pk, amount=20 * USD,
        reference="rental:1", idempotency_key="earned-hold", machine_reference="machine:1",
    )  # fmt: skip
    hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=10 * USD)
    assert team_earnings_balance(provider_team.pk) == 9 * USD
    return Account.objects.get(team=provider_team, kind=AccountKind.EARNINGS)


@pytest.fixture
def operator(client):
    from marketplace.models import User

    user = User.objects.create_superuser("op", "op@example.com", "pw-for-tests-123")
    client.force_login(user)
    return user


def form_key(html: str) -> str:
    return html.split('name="idempotency_key" value="')[1].split('"')[0]


def test_operator_records_a_payout_from_a_providers_earnings_once(
    client, operator, earned, provider_team
):
    accounts = client.get("/admin/billing/account/").content.decode()
    assert f"{PAYOUT_ADD}?account={earned.pk}" in accounts and "Record payout" in accounts
    page = client.get(PAYOUT_ADD, {"account": earned.pk}).content.decode()
    assert f"{provider_team.name} — $9.00 unpaid" in page
    assert f'<option value="{earned.pk}" selected>' in page
    data = {"account": earned.pk, "amount_usd": "4", "note": "Wire 2026-11 #77",
            "idempotency_key": form_key(page)}  # fmt: skip

    response = client.post(PAYOUT_ADD, data)
    assert response.status_code == 302 and response["Location"] == "/admin/billing/payout/"
    assert client.post(PAYOUT_ADD, data).status_code == 302  # submitted twice: recorded once

    payout = Transfer.objects.get(kind="payout")
    assert (payout.team_id, payout.amount, payout.description) == (
        provider_team.pk, 4 * USD, "Wire 2026-11 #77",
    )  # fmt: skip
    assert payout.created_by_id == operator.pk
    assert LogEntry.objects.filter(user=operator, object_id=str(payout.pk)).exists()
    assert team_earnings_balance(provider_team.pk) == 5 * USD
    assert Account.objects.get(kind=AccountKind.PAYOUTS).balance == 4 * USD
    listing = client.get("/admin/billing/payout/").content.decode()
    assert "Wire 2026-11 #77" in listing and "$4.00" in listing
    assert_ledger_consistent()

    # The provider sees it on their earnings page.
    host = UserFactory(username="host")
    add_member(provider_team, host, "owner")
    html = client_for(client, host, provider_team).get("/earnings/").content.decode()
    assert "$4.00" in html and "$5.00" in html


def test_a_payout_over_the_earnings_is_refused_with_a_clear_message(client, operator, earned):
    page = client.get(PAYOUT_ADD).content.decode()
    before = ledger_counts()
    response = client.post(
        PAYOUT_ADD,
        {"account": earned.pk, "amount_usd": "9.01", "note": "too much",
         "idempotency_key": form_key(page)},
    )  # fmt: skip
    html = response.content.decode()
    assert response.status_code == 200
    assert "Cannot pay out $9.01: the provider has $9.00 of earnings." in html
    bad = client.post(
        PAYOUT_ADD,
        {"account": earned.pk, "amount_usd": "-3", "note": "x", "idempotency_key": "k2"},
    )
    assert "must not be negative" in bad.content.decode()
    assert ledger_counts() == before


def test_staff_without_the_permission_cannot_record_payouts(client, earned):
    from marketplace.models import User

    staff = User.objects.create_user("helpdesk", "h@example.com", "pw-for-tests-123")
    staff.is_staff = True
    staff.save()
    client.force_login(staff)
    before = ledger_counts()
    assert client.get(PAYOUT_ADD).status_code == 403
    data = {"account": earned.pk, "amount_usd": "1", "note": "x", "idempotency_key": "k"}
    assert client.post(PAYOUT_ADD, data).status_code == 403
    assert ledger_counts() == before


# --- credit grants stay an operator action in production ---------------------------------------


def test_grants_work_in_production_settings_and_are_audited(
    client, operator, renter_team, settings
):
    """With Stripe configured and DEBUG off there is no test-credit button, but an operator can
    still grant support credit or a refund: recorded apart from card money, with their name,
    the reason the team sees, and an admin log entry."""
    settings.DEBUG = False
    settings.STRIPE_SECRET_KEY = "sk_live_configured"
    settings.TEST_CREDIT_ENABLED = False
    form = client.get("/admin/billing/creditgrant/add/").content.decode()
    assert "refunds and goodwill" in form
    data = {"team": renter_team.pk, "amount_usd": "12.50", "reason": "Refund: rental 42 failed",
            "idempotency_key": form_key(form)}  # fmt: skip
    assert client.post("/admin/billing/creditgrant/add/", data).status_code == 302

    grant = Transfer.objects.get(kind="grant")
    assert (grant.team_id, grant.amount, grant.created_by_id) == (
        renter_team.pk, 12_500_000, operator.pk,
    )  # fmt: skip
    assert LogEntry.objects.filter(user=operator, object_id=str(grant.pk)).exists()
    entry = grant.entries.get(account__kind=AccountKind.AVAILABLE)
    assert entry.team_id == renter_team.pk and grant.description == "Refund: rental 42 failed"
    assert Account.objects.get(kind=AccountKind.GRANTS).balance == -12_500_000
    assert not Account.objects.filter(kind=AccountKind.STRIPE_CLEARING).exclude(balance=0).exists()
    listing = client.get("/admin/billing/creditgrant/", {"q": operator.username}).content.decode()
    assert "Refund: rental 42 failed" in listing

    member = UserFactory(username="renter")
    add_member(renter_team, member, "owner")
    page = client_for(client, member, renter_team).get("/billing/").content.decode()
    assert "Refund: rental 42 failed" in page and "test credit" not in page
    assert client.post("/billing/test-credit/", {"nonce": "n"}).status_code == 404


def test_staff_need_the_grant_permission(client, renter_team):
    from django.contrib.auth.models import Permission

    from marketplace.models import User

    staff = User.objects.create_user("support", "s@example.com", "pw-for-tests-123")
    staff.is_staff = True
    staff.save()
    client.force_login(staff)
    before = ledger_counts()
    data = {"team": renter_team.pk, "amount_usd": "5", "reason": "x", "idempotency_key": "k"}
    assert client.get("/admin/billing/creditgrant/add/").status_code == 403
    assert client.post("/admin/billing/creditgrant/add/", data).status_code == 403
    assert ledger_counts() == before

    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["add_creditgrant", "view_creditgrant"])
    )
    staff = User.objects.get(pk=staff.pk)  # drop the cached permissions
    client.force_login(staff)
    assert client.post("/admin/billing/creditgrant/add/", data).status_code == 302
    assert Transfer.objects.get(kind="grant").created_by_id == staff.pk


def test_a_grant_form_resubmitted_with_another_amount_is_refused_on_the_form(
    client, operator, renter_team
):
    key = form_key(client.get("/admin/billing/creditgrant/add/").content.decode())
    data = {"team": renter_team.pk, "amount_usd": "5", "reason": "Goodwill", "idempotency_key": key}
    assert client.post("/admin/billing/creditgrant/add/", data).status_code == 302
    before = ledger_counts()
    again = client.post("/admin/billing/creditgrant/add/", {**data, "amount_usd": "50"})
    assert again.status_code == 200  # the form again, not a server error
    assert "This form already granted $5.00" in again.content.decode()
    assert client.post("/admin/billing/creditgrant/add/", data).status_code == 302  # a repeat
    assert ledger_counts() == before  # neither credited anything more
    assert Transfer.objects.get(kind="grant").amount == 5 * USD


def test_an_operator_who_granted_credit_stays_on_record(client, operator, renter_team):
    from django.db.models import ProtectedError

    credit_grant(team_id=renter_team.pk, amount=5 * USD, reason="Goodwill",
                          idempotency_key="kept", created_by_id=operator.pk)  # fmt: skip
    with pytest.raises(ProtectedError):
        operator.delete()  # deactivate the account instead
    assert Transfer.objects.get(kind="grant").created_by == operator
    page = client.get(f"/admin/marketplace/user/{operator.pk}/delete/").content.decode()
    assert "Cannot delete user" in page  # the admin says why, instead of a database error
