"""The vast.ai money commands, through the requests the CLI 1.9.1 sends
(vastai/api/billing.py show_deposit and show_invoices_v1, vastai/api/offers.py
search_invoices, vastai/api/price_increase.py): a rental's deposit is its hold, the charges
are its usage charges by day, the invoices are the credit added, and no price increase is
ever pending."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import pytest

from billing.holds import hold_capture_usage
from billing.models import Entry, Hold
from marketplace.models import Rental
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund
from tests.vast.test_translation import rent

pytestmark = [pytest.mark.django_db]


def query(**params) -> str:
    """The CLI's query string: each value JSON unless it is text (its client's _build_url)."""
    return "&".join(
        f"{name}={quote(value if isinstance(value, str) else json.dumps(value))}"
        for name, value in params.items()
    )


def rented(client, machine) -> Rental:
    response = rent(client, machine, gpus=1)
    assert response.status_code == 200, response.content
    return Rental.objects.get(instance_id=response.json()["new_contract"])


def outsider():
    other = TeamFactory(name="Other Co")
    add_member(other, UserFactory(username="other"), "owner")
    fund(other)
    return key_client(other)


def test_show_deposit_is_the_rentals_hold(funded_team, machine):
    client = key_client(funded_team)
    rental = rented(client, machine)
    hold_capture_usage(hold_id=rental.hold_id, kind="gpu", owed_total=250_000)
    hold = Hold.objects.get(pk=rental.hold_id)
    answer = client.get(f"/api/v0/instances/balance/{rental.instance_id}/?owner=me")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["instance_id"] == rental.instance_id
    assert body["held_total"] == hold.amount / 1e6
    assert body["charged"] == 0.25 and body["deposit"] == (hold.amount - 250_000) / 1e6
    assert body["covers_until"] == rental.ends_at.timestamp()
    foreign = outsider().get(f"/api/v0/instances/balance/{rental.instance_id}/")
    assert foreign.status_code == 404 and "not one of your team's" in foreign.json()["msg"]


def test_show_invoices_v1_charges_are_the_usage_charges_by_rental_and_day(funded_team, machine):
    client = key_client(funded_team)
    rental = rented(client, machine)
    hold_capture_usage(hold_id=rental.hold_id, kind="gpu", owed_total=250_000)
    hold_capture_usage(hold_id=rental.hold_id, kind="gpu", owed_total=400_000)
    now = int(time.time())
    window = {"day": {"gte": now - 7 * 86400, "lte": now + 60}}
    answer = client.get(
        "/api/v0/charges/?"
        + query(select_filters=window, latest_first=False, limit=20, format="table")
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["total"] == 1 and body["next_token"] is None
    [row] = body["results"]
    assert (row["type"], row["source"], row["amount"]) == ("instance", str(rental.instance_id), 0.4)
    assert "2 usage charge(s)" in row["description"]
    volumes_only = {**window, "type": {"in": ["volume"]}}
    assert (
        client.get("/api/v0/charges/?" + query(select_filters=volumes_only)).json()["results"] == []
    )
    before = {"day": {"gte": now - 7 * 86400, "lte": now - 86400}}
    assert client.get("/api/v0/charges/?" + query(select_filters=before)).json()["total"] == 0
    assert outsider().get("/api/v0/charges/?" + query(select_filters=window)).json()["total"] == 0


@pytest.mark.parametrize(
    "params, field",
    [
        ({}, "day"),
        ({"select_filters": {"day": {"gte": "yesterday", "lte": 1}}}, "day"),
        ({"select_filters": {"day": {"gte": 0, "lte": 1}}, "limit": 1000}, "limit"),
        ({"select_filters": {"day": {"gte": 0, "lte": 1}, "type": "volume"}}, "charge_type"),
        ({"select_filters": {"day": {"gte": 0, "lte": 1}}, "after_token": "x"}, "next_token"),
    ],
)
def test_bad_charges_requests_answer_400_naming_the_option(funded_team, params, field):
    answer = key_client(funded_team).get("/api/v0/charges/?" + query(**params))
    assert answer.status_code == 400 and field in answer.json()["error"]["fields"], answer.content


def test_charges_page_with_the_token_the_previous_page_gave(funded_team, machine):
    client = key_client(funded_team)
    for _ in range(3):
        rental = rented(client, machine)
        hold_capture_usage(hold_id=rental.hold_id, kind="gpu", owed_total=100_000)
    window = {"day": {"gte": 0, "lte": int(time.time()) + 60}}
    first = client.get("/api/v0/charges/?" + query(select_filters=window, limit=2)).json()
    assert (first["count"], first["total"]) == (2, 3) and first["next_token"]
    rest = client.get(
        "/api/v0/charges/?" + query(select_filters=window, limit=2, after_token=first["next_token"])
    ).json()
    sources = [row["source"] for row in first["results"] + rest["results"]]
    assert len(set(sources)) == 3 and rest["next_token"] is None


def test_search_invoices_lists_the_credit_added_and_filters_by_the_query(funded_team):
    fund(funded_team, 25)
    client = key_client(funded_team)
    # What `vastai search invoices 'amount_cents>3000'` sends.
    answer = client.get(
        "/api/v0/invoices?"
        + query(select_cols=["*"], select_filters={"amount_cents": {"gt": "3000"}})
    )
    assert answer.status_code == 200, answer.content
    [row] = answer.json()
    assert (row["amount_cents"], row["is_credit"], row["service"]) == (10000, True, "grant")
    assert row["balance_after"] == 100.0 and row["balance_before"] == 0.0
    everything = client.get("/api/v0/invoices?" + query(select_cols=["*"])).json()
    assert sorted(r["amount_cents"] for r in everything) == [2500, 10000]
    entry_ids = set(Entry.objects.filter(team=funded_team).values_list("pk", flat=True))
    assert {r["id"] for r in everything} <= entry_ids
    assert outsider().get("/api/v0/invoices?" + query(select_cols=["*"])).json()[0]["id"] not in {
        r["id"] for r in everything
    }


@pytest.mark.parametrize(
    "filters, field",
    [
        ({"gpu_name": {"eq": "x"}}, "gpu_name"),
        ({"amount_cents": {"gt": "lots"}}, "amount_cents"),
        ({"amount_cents": {"like": "1"}}, "amount_cents"),
        ({"is_credit": {"eq": "yes"}}, "is_credit"),
        ({"service": {"in": "grant"}}, "service"),
        ({"amount_cents": {"gt": "nan"}}, "amount_cents"),
    ],
)
def test_a_bad_invoice_query_answers_400_naming_the_field(funded_team, filters, field):
    answer = key_client(funded_team).get("/api/v0/invoices?" + query(select_filters=filters))
    assert answer.status_code == 400 and field in answer.json()["error"]["fields"], answer.content


def test_no_price_increase_is_ever_pending(funded_team, machine):
    client = key_client(funded_team)
    rental = rented(client, machine)
    pending = client.get("/api/v0/instances/pending-price-increases/")
    assert pending.status_code == 200
    assert pending.json()["pending_price_increases"] == [] and pending.json()["count"] == 0
    for verb in ("accept", "reject"):
        answer = client.put(
            f"/api/v0/instances/{verb}-price-increase/",
            {"pending_price_increase_id": rental.pk},
            format="json",
        )
        # The CLI reads this body as vast's "no longer pending" signal.
        assert answer.status_code == 404 and answer.json()["error"] == "no_pending_price_increase"


def test_show_invoices_v1_invoices_are_the_credit_added_in_the_window(funded_team):
    """``show invoices-v1 -i`` reads /api/v1/invoices/ (our API leaves the path free)."""
    client = key_client(funded_team)
    now = int(time.time())
    window = {"when": {"gte": now - 7 * 86400, "lte": now + 60}}
    answer = client.get("/api/v1/invoices/?" + query(select_filters=window, limit=20))
    assert answer.status_code == 200, answer.content
    [row] = answer.json()["results"]
    # vast's sign: a credit is negative, and the CLI shows it turned round.
    assert (row["type"], row["source"], row["amount"]) == ("credit", "grant", -100.0)
    assert row["metadata"]["invoice_id"] == row["id"]
    stripe_only = {**window, "service": {"in": ["stripe_payments"]}}
    assert client.get("/api/v1/invoices/?" + query(select_filters=stripe_only)).json()["total"] == 0
    before = {"when": {"gte": 0, "lte": now - 86400}}
    assert client.get("/api/v1/invoices/?" + query(select_filters=before)).json()["total"] == 0
    bad = client.get("/api/v1/invoices/?" + query(select_filters={"when": {"gte": "x"}}))
    assert bad.status_code == 400 and "when" in bad.json()["error"]["fields"]
