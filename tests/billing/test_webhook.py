"""The Stripe webhook with correctly signed payloads (Stripe's real signing scheme)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection
from django.test import Client

from billing.models import StripeEvent, TopUp, Transfer, TransferKind
from billing.selectors import team_balance
from tests.billing.ledger_checks import assert_ledger_consistent, ledger_counts
from tests.billing.stripe_fakes import post_event, session_event, stripe_signature
from tests.factories import TeamFactory

pytestmark = pytest.mark.usefixtures("stripe_settings")

USD = 1_000_000


@pytest.fixture
def topup(db, renter_team):
    return TopUp.objects.create(
        team=renter_team, amount=25 * USD, checkout_session_id="cs_test_abc"
    )


def snapshot():
    return (*ledger_counts(), StripeEvent.objects.count())


@pytest.mark.django_db
def test_paid_checkout_credits_the_team_once(client, topup, renter_team):
    event = session_event(event_id="evt_1", topup=topup)
    first = post_event(client, event)
    assert first.status_code == 200 and first.json()["status"] == "processed"
    assert team_balance(renter_team.id).available == 25 * USD
    again = post_event(client, event)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    # The other success event for the same session does not credit again either.
    post_event(client, session_event(event_id="evt_2", topup=topup,
                                     event_type="checkout.session.async_payment_succeeded"))  # fmt: skip
    assert team_balance(renter_team.id).available == 25 * USD
    topup.refresh_from_db()
    assert topup.status == "paid" and topup.amount_paid == 25 * USD and topup.transfer_id
    stored = StripeEvent.objects.get(event_id="evt_1")
    assert stored.status == "processed" and stored.deliveries == 2
    assert Transfer.objects.filter(kind=TransferKind.TOPUP).count() == 1
    assert_ledger_consistent()


@pytest.mark.django_db
def test_unpaid_completion_waits_for_the_async_result(client, topup, renter_team):
    post_event(client, session_event(event_id="evt_u", topup=topup, payment_status="unpaid"))
    topup.refresh_from_db()
    assert topup.status == "processing"
    assert team_balance(renter_team.id).available == 0
    post_event(client, session_event(event_id="evt_ok", topup=topup,
                                     event_type="checkout.session.async_payment_succeeded"))  # fmt: skip
    assert team_balance(renter_team.id).available == 25 * USD


@pytest.mark.django_db
def test_failed_async_payment_marks_the_topup_and_credits_nothing(client, topup, renter_team):
    response = post_event(client, session_event(event_id="evt_f", topup=topup,
                                                event_type="checkout.session.async_payment_failed"))  # fmt: skip
    assert response.status_code == 200
    topup.refresh_from_db()
    assert topup.status == "failed"
    assert team_balance(renter_team.id).available == 0
    assert StripeEvent.objects.get(event_id="evt_f").status == "processed"


@pytest.mark.django_db
def test_success_after_a_late_failure_event_still_credits_once(client, topup, renter_team):
    post_event(client, session_event(event_id="evt_a", topup=topup,
                                     event_type="checkout.session.async_payment_succeeded"))  # fmt: skip
    post_event(client, session_event(event_id="evt_b", topup=topup,
                                     event_type="checkout.session.async_payment_failed"))  # fmt: skip
    topup.refresh_from_db()
    assert topup.status == "paid"
    assert team_balance(renter_team.id).available == 25 * USD


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"metadata": {"team_id": "0", "topup_id": "0"}}, "No top-up"),
        ({"id": "cs_other"}, "does not belong"),
        ({"currency": "eur"}, "Currency"),
    ],
)
def test_events_that_are_not_ours_are_stored_as_ignored(client, topup, renter_team, change, reason):
    event = session_event(event_id="evt_x", topup=topup)
    event["data"]["object"].update(change)
    response = post_event(client, event)
    assert response.status_code == 200
    stored = StripeEvent.objects.get(event_id="evt_x")
    assert stored.status == "ignored" and reason in stored.detail
    assert team_balance(renter_team.id).available == 0


@pytest.mark.django_db
def test_unhandled_event_types_are_recorded_and_ignored(client):
    response = post_event(
        client, {"id": "evt_other", "type": "customer.created", "data": {"object": {}}}
    )
    assert response.status_code == 200
    assert StripeEvent.objects.get(event_id="evt_other").status == "ignored"


@pytest.mark.django_db
def test_wrong_signature_is_refused_and_nothing_written(client, topup):
    body = json.dumps(session_event(event_id="evt_w", topup=topup)).encode()
    before = snapshot()
    response = post_event(client, body, signature=stripe_signature(body, secret="whsec_wrong"))
    assert response.status_code == 400
    assert snapshot() == before


@pytest.mark.django_db
def test_body_changed_by_one_byte_is_refused(client, topup):
    body = json.dumps(session_event(event_id="evt_t", topup=topup, cents=2500)).encode()
    signature = stripe_signature(body)
    tampered = body.replace(b'"amount_total": 2500', b'"amount_total": 9500')
    assert len(tampered) == len(body) and tampered != body
    before = snapshot()
    assert post_event(client, tampered, signature=signature).status_code == 400
    assert snapshot() == before


@pytest.mark.django_db
def test_timestamp_older_than_the_tolerance_is_refused(client, topup, settings):
    body = json.dumps(session_event(event_id="evt_old", topup=topup)).encode()
    old = int(time.time()) - settings.STRIPE_WEBHOOK_TOLERANCE - 5
    before = snapshot()
    assert (
        post_event(client, body, signature=stripe_signature(body, timestamp=old)).status_code == 400
    )
    assert snapshot() == before


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["", "garbage", "t=1,v1="])
def test_missing_or_malformed_signature_is_refused(client, topup, header):
    before = snapshot()
    body = json.dumps(session_event(event_id="evt_m", topup=topup)).encode()
    assert post_event(client, body, signature=header).status_code == 400
    assert snapshot() == before


@pytest.mark.django_db
def test_webhook_without_a_configured_secret_refuses_everything(client, topup, settings):
    settings.STRIPE_WEBHOOK_SECRET = ""
    body = json.dumps(session_event(event_id="evt_n", topup=topup)).encode()
    before = snapshot()
    assert post_event(client, body, signature=stripe_signature(body, secret="")).status_code == 400
    assert snapshot() == before


@pytest.mark.django_db
def test_webhook_only_accepts_post(client):
    assert client.get("/billing/stripe/webhook/").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_same_event_delivered_ten_times_at_once_credits_once(stripe_settings):
    team = TeamFactory()
    topup = TopUp.objects.create(team=team, amount=40 * USD, checkout_session_id="cs_test_10")
    body = json.dumps(session_event(event_id="evt_10x", topup=topup)).encode()
    signature = stripe_signature(body)
    barrier = threading.Barrier(10)
    statuses: list[int] = []

    def deliver():
        try:
            barrier.wait(timeout=10)
            statuses.append(post_event(Client(), body, signature=signature).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert statuses == [200] * 10
    assert team_balance(team.id).available == 40 * USD
    assert Transfer.objects.filter(kind=TransferKind.TOPUP).count() == 1
    event = StripeEvent.objects.get(event_id="evt_10x")
    assert event.status == "processed" and event.deliveries == 10
    assert_ledger_consistent()
