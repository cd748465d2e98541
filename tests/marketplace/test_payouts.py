"""Payouts as a provider asks for them: ``/api/v1/payouts/`` and the console's Payouts page.

Bad input answers 4xx naming the field and writes nothing (ledger, requests); another team's
request answers 404; a retry with the same key asks once."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from billing import payouts
from billing.credits import credit_grant
from billing.holds import hold_capture_usage, hold_create
from billing.models import Account, PayoutRequest
from marketplace.models import ApiKey, Role
from tests.billing.ledger_checks import assert_ledger_consistent, ledger_counts
from tests.conftest import client_for, key_client
from tests.factories import TeamFactory, UserFactory, add_member

pytestmark = pytest.mark.django_db

USD = 1_000_000
API = "/api/v1/payouts/"


@pytest.fixture(autouse=True)
def minimum(settings):
    settings.BILLING_PAYOUT_MIN = 5 * USD


def earn(provider, dollars: int, tag: str) -> None:
    """``provider`` earns ``dollars`` (a renter's charge of dollars / 0.9, less the 10% fee)."""
    renter = TeamFactory(name=f"renter {tag}")
    gross = dollars * USD * 10 // 9
    credit_grant(team_id=renter.pk, amount=gross + USD, reason="t", idempotency_key=f"g-{tag}")
    hold = hold_create(
        team_id=renter.pk, provider_team_id=provider.pk, amount=gross + USD,
        reference=f"rental:{tag}", idempotency_key=f"h-{tag}", machine_reference="machine:1",
    )  # fmt: skip
    hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=gross)


@pytest.fixture
def earned(team, owner):
    earn(team, 36, "acme")
    assert Account.objects.get(team=team, kind="earnings").balance == 36 * USD
    return team


def post(client, data, **headers):
    return client.post(API, data, content_type="application/json", **headers)


def written() -> tuple:
    return ledger_counts(), list(PayoutRequest.objects.values())


def test_provider_asks_through_the_api_and_sees_it_listed(earned, owner_client):
    response = post(owner_client, {"amount": "20.50"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["amount"], body["status"], body["reason"]) == ("20.500000", "requested", "")
    assert owner_client.get(API).json()["results"] == [body]
    assert owner_client.get(f"{API}{body['id']}/").json() == body
    balance = owner_client.get("/api/v1/billing/balance/").json()
    assert balance["earnings"] == "15.500000"
    kinds = [e["kind"] for e in owner_client.get("/api/v1/billing/ledger/").json()["results"]]
    assert kinds.count("payout_request") == 2  # both legs: earnings −, payout_pending +
    assert_ledger_consistent()

    payouts.payout_reject(payout_id=body["id"], reason="Add bank details", decided_by_id=None)
    row = owner_client.get(f"{API}{body['id']}/").json()
    assert (row["status"], row["reason"]) == ("rejected", "Add bank details")
    assert owner_client.get("/api/v1/billing/balance/").json()["earnings"] == "36.000000"


@pytest.mark.parametrize(
    ("data", "status", "field"),
    [
        ({"amount": "-5"}, 400, "amount"),
        ({"amount": "0"}, 400, "amount"),
        ({"amount": 0}, 400, "amount"),
        ({"amount": "4.99"}, 400, "amount"),  # under the minimum
        ({"amount": "10.001"}, 400, "amount"),  # past cents
        ({"amount": "1e3"}, 400, "amount"),
        ({"amount": "ten"}, 400, "amount"),
        ({"amount": None}, 400, "amount"),
        ({"amount": True}, 400, "amount"),
        ({"amount": ["10"]}, 400, "amount"),
        ({}, 400, "amount"),
        ({"amount": "9" * 40}, 400, "amount"),  # huge
        ({"amount": "999999999.99"}, 409, "amount"),  # over the earnings
        ({"amount": "36.01"}, 409, "amount"),
        ({"amount": "10", "idempotency_key": "k" * 151}, 400, "idempotency_key"),
    ],
)
def test_bad_input_answers_4xx_naming_the_field_and_writes_nothing(
    earned, owner_client, data, status, field
):
    before = written()
    response = post(owner_client, data)
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert written() == before


def test_an_over_long_idempotency_header_is_refused_by_name(earned, owner_client):
    before = written()
    response = post(owner_client, {"amount": "10"}, HTTP_IDEMPOTENCY_KEY="k" * 151)
    assert response.status_code == 400
    assert "idempotency_key" in response.json()["error"]["fields"]
    assert written() == before


def test_a_retry_with_the_same_key_asks_once_and_a_second_request_waits(earned, owner_client):
    first = post(owner_client, {"amount": "10"}, HTTP_IDEMPOTENCY_KEY="retry-1")
    assert first.status_code == 201
    before = written()
    again = post(owner_client, {"amount": "10"}, HTTP_IDEMPOTENCY_KEY="retry-1")
    assert (again.status_code, again.json()) == (200, first.json())
    other = post(owner_client, {"amount": "11"}, HTTP_IDEMPOTENCY_KEY="retry-1")
    assert other.status_code == 409 and "idempotency_key" in other.json()["error"]["fields"]
    second = post(owner_client, {"amount": "5"})
    assert second.status_code == 409
    assert "waiting for approval" in second.json()["error"]["message"]
    assert written() == before


def test_another_teams_request_is_not_found_and_not_listed(earned, owner_client, outsider):
    mine = post(owner_client, {"amount": "10"}).json()
    theirs = client_for(Client(), outsider)
    assert theirs.get(f"{API}{mine['id']}/").status_code == 404
    assert theirs.get(API).json()["results"] == []
    for method in ("put", "patch", "delete"):
        response = getattr(theirs, method)(f"{API}{mine['id']}/")
        assert response.status_code in (404, 405)
    assert owner_client.delete(f"{API}{mine['id']}/").status_code == 405  # asked is asked


def test_asking_needs_the_admin_role_and_a_key_for_providers(earned, teammate):
    member = client_for(Client(), teammate, earned)
    before = written()
    refused = post(member, {"amount": "10"})
    assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
    assert member.get(API).status_code == 200  # members read
    renter_key = key_client(earned, audience=ApiKey.Audience.RENTER)
    assert post(renter_key, {"amount": "10"}).status_code == 403
    read_key = key_client(earned, access=ApiKey.Access.READ)
    assert post(read_key, {"amount": "10"}).status_code == 403
    assert written() == before
    assert post(key_client(earned), {"amount": "10"}).status_code == 201


# --- the console ----------------------------------------------------------------------------


def nonce(page: str) -> str:
    return re.search(r'name="nonce" value="([^"]+)"', page)[1]


def test_console_page_asks_once_per_form_and_lists_the_history(earned, owner_client):
    page = owner_client.get("/payouts/").content.decode()
    assert "$36.00" in page and 'value="36.00"' in page and "No payouts yet" in page
    form = {"amount": "12.34", "nonce": nonce(page)}
    response = owner_client.post("/payouts/", form)
    assert response.status_code == 302 and response["Location"] == "/payouts/"
    assert owner_client.post("/payouts/", form).status_code == 302  # submitted twice
    assert PayoutRequest.objects.filter(team=earned).count() == 1
    page = owner_client.get("/payouts/").content.decode()
    assert "$12.34" in page and "waiting for approval" in page
    assert "$23.66" in page  # unpaid earnings now
    assert 'id="payout-form"' not in page  # one waits at a time
    assert_ledger_consistent()


@pytest.mark.parametrize(
    ("amount", "says"),
    [
        ("-1", "must not be negative"),
        ("0", "minimum payout is $5.00"),
        ("abc", "is not an amount in dollars"),
        ("1" * 30, "Amount"),
        ("100000", "More than your unpaid earnings ($36.00)"),
        ("2.50", "minimum payout is $5.00"),
    ],
)
def test_console_bad_amounts_answer_400_naming_the_field(earned, owner_client, amount, says):
    page = owner_client.get("/payouts/").content.decode()
    before = written()
    response = owner_client.post("/payouts/", {"amount": amount, "nonce": nonce(page)})
    assert response.status_code == 400
    errors = response.content.decode().split('id="payout-errors"')[1].split("</div>")[0]
    assert "Amount:" in errors and says in errors
    assert written() == before


def test_console_members_read_but_cannot_ask(earned, teammate):
    member = client_for(Client(), teammate, earned)
    page = member.get("/payouts/").content.decode()
    assert "Only the team's admins and owner" in page and 'id="payout-form"' not in page
    before = written()
    assert member.post("/payouts/", {"amount": "10", "nonce": "x"}).status_code == 302
    assert written() == before


def test_a_provider_with_less_than_the_minimum_is_told_so(team, owner_client):
    page = owner_client.get("/payouts/").content.decode()
    assert "The minimum payout is $5.00" in page and 'id="payout-form"' not in page


def test_the_other_teams_history_is_not_shown(earned, owner_client, outsider):
    payouts.payout_request_create(team_id=earned.pk, amount=7 * USD)
    theirs = client_for(Client(), outsider).get("/payouts/").content.decode()
    assert "$7.00" not in theirs and "No payouts yet" in theirs


def test_an_admin_of_a_second_team_asks_for_that_team(earned, db):
    second = TeamFactory(name="Second")
    user = UserFactory(username="second-admin")
    add_member(second, user, Role.ADMIN)
    earn(second, 9, "second")
    client = client_for(Client(), user, second)
    assert post(client, {"amount": "9"}).status_code == 201
    assert PayoutRequest.objects.get().team == second


# --- the provider cancels a waiting request ---------------------------------------------------


def test_provider_cancels_a_waiting_request_through_the_api(earned, owner_client):
    asked = post(owner_client, {"amount": "20"}).json()
    response = owner_client.post(f"{API}{asked['id']}/cancel/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["status"]) == (asked["id"], "cancelled")
    assert body["decided_at"] is not None
    assert owner_client.get("/api/v1/billing/balance/").json()["earnings"] == "36.000000"
    kinds = [e["kind"] for e in owner_client.get("/api/v1/billing/ledger/").json()["results"]]
    assert kinds.count("payout_cancel") == 2  # both legs: payout_pending −, earnings +
    assert_ledger_consistent()

    before = written()
    again = owner_client.post(f"{API}{asked['id']}/cancel/")
    assert again.status_code == 200 and again.json() == body  # the same answer
    assert written() == before
    assert post(owner_client, {"amount": "36"}).status_code == 201  # the next one may be asked


@pytest.mark.parametrize("decided", ["paid", "rejected"])
def test_cancelling_a_decided_request_answers_409_saying_why(earned, owner_client, decided):
    asked = post(owner_client, {"amount": "10"}).json()
    if decided == "paid":
        payouts.payout_approve(payout_id=asked["id"], note="SEPA 7", decided_by_id=None)
    else:
        payouts.payout_reject(payout_id=asked["id"], reason="no", decided_by_id=None)
    before = written()
    response = owner_client.post(f"{API}{asked['id']}/cancel/")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "payout_conflict"
    assert f"already {decided} by the operator" in error["message"]
    assert written() == before


def test_cancelling_needs_the_admin_role_and_another_teams_request_is_not_found(
    earned, owner_client, teammate, outsider
):
    asked = post(owner_client, {"amount": "10"}).json()
    url = f"{API}{asked['id']}/cancel/"
    before = written()
    member = client_for(Client(), teammate, earned)
    refused = member.post(url)
    assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
    assert key_client(earned, access=ApiKey.Access.READ).post(url).status_code == 403
    assert client_for(Client(), outsider).post(url).status_code == 404
    assert (
        client_for(Client(), outsider).post(f"{API}{asked['id'] + 999}/cancel/").status_code == 404
    )
    assert written() == before
    assert PayoutRequest.objects.get(pk=asked["id"]).status == "requested"


def test_console_cancels_a_waiting_request_and_asks_first(earned, owner_client):
    page = owner_client.get("/payouts/").content.decode()
    owner_client.post("/payouts/", {"amount": "12.34", "nonce": nonce(page)})
    payout = PayoutRequest.objects.get(team=earned)
    page = owner_client.get("/payouts/").content.decode()
    cancel = re.search(r'<form[^>]*action="/payouts/(\d+)/cancel/"[^>]*>', page)
    assert cancel and int(cancel[1]) == payout.pk
    assert "confirm(" in cancel[0]  # asks first, as revoking a key does

    response = owner_client.post(f"/payouts/{payout.pk}/cancel/")
    assert response.status_code == 302 and response["Location"] == "/payouts/"
    payout.refresh_from_db()
    assert payout.status == "cancelled"
    page = owner_client.get("/payouts/").content.decode()
    assert "cancelled" in page and "$36.00" in page and 'id="payout-form"' in page
    assert "/cancel/" not in page  # nothing is waiting now
    assert_ledger_consistent()

    before = written()
    again = owner_client.post(f"/payouts/{payout.pk}/cancel/", follow=True)
    assert written() == before
    assert again.status_code == 200


def test_console_paid_request_cannot_be_cancelled_and_says_why(earned, owner_client):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=10 * USD)
    payouts.payout_approve(payout_id=payout.pk, decided_by_id=None)
    before = written()
    page = owner_client.post(f"/payouts/{payout.pk}/cancel/", follow=True).content.decode()
    assert "already paid by the operator" in page
    assert written() == before


def test_console_members_cannot_cancel_and_outsiders_get_404(earned, teammate, outsider):
    payout, _ = payouts.payout_request_create(team_id=earned.pk, amount=10 * USD)
    member = client_for(Client(), teammate, earned)
    assert "/cancel/" not in member.get("/payouts/").content.decode()
    before = written()
    page = member.post(f"/payouts/{payout.pk}/cancel/", follow=True).content.decode()
    assert "admins and owner can cancel a payout request" in page
    assert client_for(Client(), outsider).post(f"/payouts/{payout.pk}/cancel/").status_code == 404
    assert client_for(Client(), outsider).get(f"/payouts/{payout.pk}/cancel/").status_code in (
        404,
        405,
    )
    assert written() == before
