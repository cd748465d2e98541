"""Checkout Sessions are created through the official Stripe SDK against a local endpoint."""

from __future__ import annotations

import pytest

from billing.errors import InvalidAmount, PaymentProviderError, PaymentsUnavailable
from billing.models import TopUp
from billing.topups import topup_checkout_create, topup_checkout_start
from tests.billing.stripe_fakes import FakeStripeApi

pytestmark = pytest.mark.django_db

USD = 1_000_000


def start(team, amount=25 * USD):
    return topup_checkout_start(
        team_id=team.id,
        amount=amount,
        success_url="https://app.example/billing/topup/return/?session_id={CHECKOUT_SESSION_ID}",
        cancel_url="https://app.example/billing/topup/cancel/",
    )


def test_checkout_session_request_carries_amount_currency_metadata_and_key(
    fake_stripe, renter_team
):
    topup = start(renter_team, 25_500_000)
    assert len(fake_stripe.requests) == 1
    request = fake_stripe.requests[0]
    assert request["path"] == "/v1/checkout/sessions"
    assert request["headers"]["authorization"] == "Bearer sk_test_local"
    assert request["headers"]["idempotency-key"] == f"topup-{topup.pk}"
    form = request["form"]
    assert form["mode"] == "payment"
    assert form["line_items[0][price_data][unit_amount]"] == "2550"
    assert form["line_items[0][price_data][currency]"] == "usd"
    assert form["line_items[0][quantity]"] == "1"
    assert form["metadata[team_id]"] == str(renter_team.id)
    assert form["metadata[topup_id]"] == str(topup.pk)
    assert form["payment_intent_data[metadata][topup_id]"] == str(topup.pk)
    assert form["client_reference_id"] == f"topup-{topup.pk}"
    assert form["success_url"].endswith("session_id={CHECKOUT_SESSION_ID}")
    topup.refresh_from_db()
    assert topup.status == "pending"
    assert topup.checkout_session_id == "cs_test_local_1"
    assert topup.checkout_url == "https://checkout.stripe.com/c/pay/cs_test_local_1"


def test_checkout_create_returns_the_session_url(fake_stripe, renter_team):
    url = topup_checkout_create(
        team_id=renter_team.id, amount=10 * USD, success_url="https://a/s", cancel_url="https://a/c"
    )
    assert url == "https://checkout.stripe.com/c/pay/cs_test_local_1"


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        (4_990_000, "minimum"),
        (10_000_010_000, "maximum"),
        (5_000_001, "whole cents"),
        (0, "positive"),
    ],
)
def test_amounts_outside_the_limits_never_reach_stripe(fake_stripe, renter_team, amount, message):
    with pytest.raises(InvalidAmount, match=message):
        start(renter_team, amount)
    assert fake_stripe.requests == []
    assert not TopUp.objects.exists()


def test_without_a_stripe_key_there_are_no_card_payments(settings, renter_team):
    settings.STRIPE_SECRET_KEY = ""
    with pytest.raises(PaymentsUnavailable):
        start(renter_team)
    assert not TopUp.objects.exists()


def test_stripe_error_marks_the_topup_failed(stripe_settings, renter_team):
    with FakeStripeApi(status=400) as api:
        stripe_settings.STRIPE_API_BASE = api.base_url
        with pytest.raises(PaymentProviderError):
            start(renter_team)
    topup = TopUp.objects.get()
    assert topup.status == "failed" and topup.failure_reason
