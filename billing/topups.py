"""Card top-ups through Stripe Checkout, and the processing of Stripe's webhook events.

Crediting a wallet happens at most once per top-up, whatever the order or number of event
deliveries; the network call to Stripe never happens inside a transaction that holds locks.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from billing import stripe_gateway
from billing.errors import InvalidAmount, PaymentProviderError, PaymentsUnavailable
from billing.ledger import Posting, balances_notify, lock_accounts, postings_write, require_amount
from billing.models import (
    AccountKind,
    StripeEvent,
    StripeEventStatus,
    TopUp,
    TopUpStatus,
    Transfer,
    TransferKind,
)
from billing.money import MICRO_PER_CENT, format_usd
from billing.signals import topup_credited

logger = logging.getLogger(__name__)


def topup_limits() -> tuple[int, int]:
    return settings.BILLING_TOPUP_MIN, settings.BILLING_TOPUP_MAX


def topup_validate_amount(amount: int) -> None:
    """Whole cents, within the configured minimum and maximum (InvalidAmount otherwise)."""
    require_amount(amount)
    low, high = topup_limits()
    if amount % MICRO_PER_CENT:
        raise InvalidAmount("Top-ups are in whole cents.")
    if amount < low:
        raise InvalidAmount(f"The minimum top-up is {format_usd(low)}.")
    if amount > high:
        raise InvalidAmount(f"The maximum top-up is {format_usd(high)}.")


def topup_checkout_start(
    *,
    team_id: int,
    amount: int,
    success_url: str,
    cancel_url: str,
    created_by_id: int | None = None,
) -> TopUp:
    """Record a pending top-up and open a Stripe Checkout Session for it.

    Deliberately not one transaction: the network call to Stripe happens between two short
    writes and never while a transaction holds locks. The session is created with the
    idempotency key ``topup-<id>`` (a retried request cannot create a second session) and
    metadata naming the team and the top-up, which the webhook checks before crediting.
    """
    if not settings.STRIPE_SECRET_KEY:
        raise PaymentsUnavailable("Card payments are not configured on this server.")
    topup_validate_amount(amount)
    topup = TopUp.objects.create(team_id=team_id, amount=amount, created_by_id=created_by_id)
    try:
        session = stripe_gateway.checkout_session_create(
            amount_cents=amount // MICRO_PER_CENT,
            currency=settings.BILLING_CURRENCY,
            product_name=settings.BILLING_TOPUP_PRODUCT_NAME,
            success_url=success_url,
            cancel_url=cancel_url,
            metadata={"team_id": str(team_id), "topup_id": str(topup.pk)},
            client_reference_id=f"topup-{topup.pk}",
            idempotency_key=f"topup-{topup.pk}",
        )
    except stripe_gateway.GatewayError as error:
        TopUp.objects.filter(pk=topup.pk).update(
            status=TopUpStatus.FAILED, failure_reason=str(error)[:300]
        )
        raise PaymentProviderError(
            "Stripe could not start the payment; nothing was charged. Try again in a minute."
        ) from error
    TopUp.objects.filter(pk=topup.pk).update(
        checkout_session_id=session.id, checkout_url=session.url
    )
    topup.checkout_session_id, topup.checkout_url = session.id, session.url
    return topup


def topup_checkout_create(*, team_id: int, amount: int, success_url: str, cancel_url: str) -> str:
    """The Checkout Session URL to send the payer to (see ``topup_checkout_start``)."""
    return topup_checkout_start(
        team_id=team_id, amount=amount, success_url=success_url, cancel_url=cancel_url
    ).checkout_url


class StripeEventResult(NamedTuple):
    event: StripeEvent
    duplicate: bool


class _Ignore(Exception):
    """The event is valid but not ours to act on (recorded as ignored, answered 200)."""


def stripe_event_process(*, payload: dict[str, Any]) -> StripeEventResult:
    """Store a verified Stripe event once and handle it; crediting happens at most once.

    The event row is inserted with ON CONFLICT DO NOTHING and then locked, so concurrent
    deliveries of one event queue behind the first; once it is processed or ignored, later
    deliveries only count. A handler error is recorded as ``failed`` (the credit itself rolled
    back to a savepoint) and the next delivery tries again. Crediting is keyed on the top-up,
    so ``completed`` and ``async_payment_succeeded`` for one session credit once in any order.
    """
    event_id, event_type = str(payload["id"]), str(payload.get("type", ""))
    with transaction.atomic():
        StripeEvent.objects.bulk_create(
            [
                StripeEvent(
                    event_id=event_id,
                    type=event_type[:100],
                    livemode=bool(payload.get("livemode")),
                    payload=payload,
                )
            ],
            ignore_conflicts=True,
        )
        event = StripeEvent.objects.select_for_update().get(event_id=event_id)
        if event.status in (StripeEventStatus.PROCESSED, StripeEventStatus.IGNORED):
            StripeEvent.objects.filter(pk=event.pk).update(deliveries=F("deliveries") + 1)
            return StripeEventResult(event, True)
        if event.handled_at is not None:  # a failed earlier attempt: this is a redelivery
            event.deliveries += 1
        try:
            with transaction.atomic():
                event.detail = _stripe_event_dispatch(event_type, payload)
            event.status = StripeEventStatus.PROCESSED
        except _Ignore as reason:
            event.status, event.detail = StripeEventStatus.IGNORED, str(reason)
        except Exception as error:
            logger.exception("Stripe event %s (%s) failed", event_id, event_type)
            event.status, event.detail = (
                StripeEventStatus.FAILED,
                f"{type(error).__name__}: {error}",
            )
        event.handled_at = timezone.now()
        event.save(update_fields=["status", "detail", "handled_at", "deliveries"])
    return StripeEventResult(event, False)


def _stripe_event_dispatch(event_type: str, payload: dict[str, Any]) -> str:
    session = (payload.get("data") or {}).get("object") or {}
    if event_type == "checkout.session.completed":
        status = session.get("payment_status")
        if status == "paid":
            return _topup_credit(session)
        if status == "unpaid":
            return _topup_mark(session, TopUpStatus.PROCESSING, "Waiting for the payment to clear.")
        raise _Ignore(f"payment_status {status!r} needs no credit.")
    if event_type == "checkout.session.async_payment_succeeded":
        return _topup_credit(session)
    if event_type == "checkout.session.async_payment_failed":
        return _topup_mark(session, TopUpStatus.FAILED, "The payment failed.")
    if event_type == "checkout.session.expired":
        return _topup_mark(session, TopUpStatus.EXPIRED, "The checkout expired unpaid.")
    raise _Ignore(f"{event_type} is not handled.")


def _topup_for_session(session: dict[str, Any]) -> TopUp:
    """The top-up a Checkout Session pays for, locked; _Ignore if it is not one of ours."""
    metadata = session.get("metadata") or {}
    topup_id, team_id = str(metadata.get("topup_id", "")), str(metadata.get("team_id", ""))
    if not topup_id.isdigit() or not team_id.isdigit():
        raise _Ignore("The session carries no top-up metadata.")
    topup = TopUp.objects.select_for_update().filter(pk=int(topup_id)).first()
    if topup is None or topup.team_id != int(team_id):
        raise _Ignore(f"No top-up {topup_id} for team {team_id}.")
    if topup.checkout_session_id and topup.checkout_session_id != session.get("id"):
        raise _Ignore(f"Session {session.get('id')} does not belong to top-up {topup.pk}.")
    if session.get("mode") not in (None, "payment"):
        raise _Ignore("Not a one-time payment.")
    return topup


def _topup_mark(session: dict[str, Any], status: str, reason: str) -> str:
    topup = _topup_for_session(session)
    if topup.status == TopUpStatus.PAID:
        return f"Top-up {topup.pk} is already credited; {status} ignored."
    TopUp.objects.filter(pk=topup.pk).update(
        status=status,
        failure_reason=reason if status != TopUpStatus.PROCESSING else "",
        checkout_session_id=topup.checkout_session_id or session.get("id"),
    )
    return f"Top-up {topup.pk} is {status}."


def _topup_credit(session: dict[str, Any]) -> str:
    """Credit what the session collected to the team's available balance, exactly once."""
    topup = _topup_for_session(session)
    if topup.status == TopUpStatus.PAID:
        return f"Top-up {topup.pk} was already credited."
    currency = str(session.get("currency") or "").lower()
    if currency != settings.BILLING_CURRENCY:
        raise _Ignore(f"Currency {currency!r} is not {settings.BILLING_CURRENCY}.")
    cents = session.get("amount_total")
    if not isinstance(cents, int) or isinstance(cents, bool) or cents <= 0:
        raise _Ignore(f"amount_total {cents!r} is not a positive number of cents.")
    amount = cents * MICRO_PER_CENT
    if amount != topup.amount:
        logger.warning("Top-up %s asked %s, Stripe collected %s", topup.pk, topup.amount, amount)
    available_key = (topup.team_id, AccountKind.AVAILABLE)
    accounts = lock_accounts([available_key, (None, AccountKind.STRIPE_CLEARING)])
    transfer = Transfer(
        kind=TransferKind.TOPUP,
        idempotency_key=f"topup:{topup.pk}",
        team_id=topup.team_id,
        reference=f"topup:{topup.pk}",
        description=f"Card payment (Stripe {session.get('id', '')})"[:300],
        amount=amount,
        created_by_id=topup.created_by_id,
    )
    postings_write(
        [
            Posting(
                transfer,
                [
                    (accounts[(None, AccountKind.STRIPE_CLEARING)], -amount),
                    (accounts[available_key], amount),
                ],
            )
        ]
    )
    TopUp.objects.filter(pk=topup.pk).update(
        status=TopUpStatus.PAID,
        amount_paid=amount,
        transfer=transfer,
        credited_at=timezone.now(),
        failure_reason="",
        checkout_session_id=topup.checkout_session_id or session.get("id"),
    )
    balances_notify([topup.team_id])
    team_id, topup_id = topup.team_id, topup.pk
    transaction.on_commit(
        lambda: topup_credited.send_robust(
            sender=TopUp, team_id=team_id, topup_id=topup_id, amount=amount
        )
    )
    return f"Credited {format_usd(amount)} to team {topup.team_id}."


def topups_expire_stale(*, older_than: timedelta = timedelta(hours=25)) -> int:
    """Mark top-ups whose Checkout Session can no longer be paid (Stripe expires them after
    24 hours) as expired; a late ``completed`` event would still credit them."""
    cutoff = timezone.now() - older_than
    return TopUp.objects.filter(status__in=[TopUpStatus.PENDING], created_at__lt=cutoff).update(
        status=TopUpStatus.EXPIRED, failure_reason="The checkout expired unpaid."
    )
