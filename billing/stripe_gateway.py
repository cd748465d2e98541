"""The one place that talks to Stripe, through the official SDK.

Tests point the SDK at a local HTTP endpoint with ``STRIPE_API_BASE``; nothing here is mocked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import stripe
from django.conf import settings

if TYPE_CHECKING:
    from stripe.checkout import SessionService


class GatewayError(Exception):
    """Stripe refused or could not be reached."""


class CheckoutSession(NamedTuple):
    id: str
    url: str


def stripe_client() -> stripe.StripeClient:
    # Retries are safe: every create carries an idempotency key.
    return stripe.StripeClient(
        settings.STRIPE_SECRET_KEY,
        base_addresses={"api": settings.STRIPE_API_BASE} if settings.STRIPE_API_BASE else {},
        max_network_retries=2,
    )


def checkout_session_create(
    *,
    amount_cents: int,
    currency: str,
    product_name: str,
    success_url: str,
    cancel_url: str,
    metadata: dict[str, str],
    client_reference_id: str,
    idempotency_key: str,
) -> CheckoutSession:
    params: SessionService.CreateParams = {
        "mode": "payment",
        "line_items": [
            {
                "quantity": 1,
                "price_data": {
                    "currency": currency,
                    "unit_amount": amount_cents,
                    "product_data": {"name": product_name},
                },
            }
        ],
        "success_url": success_url,
        "cancel_url": cancel_url,
        "client_reference_id": client_reference_id,
        "metadata": metadata,
        "payment_intent_data": {"metadata": metadata},
    }
    try:
        session = stripe_client().v1.checkout.sessions.create(
            params=params, options={"idempotency_key": idempotency_key}
        )
    except stripe.StripeError as error:
        raise GatewayError(error.user_message or str(error)) from error
    if not session.id or not session.url:
        raise GatewayError("Stripe answered without a session id or URL.")
    return CheckoutSession(id=session.id, url=session.url)


def connect_transfer_create(
    *,
    amount_cents: int,
    currency: str,
    destination: str,
    metadata: dict[str, str],
    idempotency_key: str,
) -> str:
    """Send money from the platform's Stripe balance to a connected account (Stripe
    Connect); returns the transfer's id. The same key returns the same transfer."""
    try:
        transfer = stripe_client().v1.transfers.create(
            params={
                "amount": amount_cents,
                "currency": currency,
                "destination": destination,
                "metadata": metadata,
            },
            options={"idempotency_key": idempotency_key},
        )
    except stripe.StripeError as error:
        raise GatewayError(error.user_message or str(error)) from error
    if not transfer.id:
        raise GatewayError("Stripe answered without a transfer id.")
    return str(transfer.id)


def webhook_event_verify(payload: bytes, signature: str) -> None:
    """Raise ValueError or stripe.SignatureVerificationError unless Stripe signed ``payload``."""
    secret = settings.STRIPE_WEBHOOK_SECRET
    if not secret:
        raise ValueError("STRIPE_WEBHOOK_SECRET is not set.")
    # The SDK leaves this one function unannotated.
    stripe.Webhook.construct_event(  # type: ignore[no-untyped-call]
        payload, signature, secret, tolerance=settings.STRIPE_WEBHOOK_TOLERANCE
    )
