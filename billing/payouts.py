"""Payouts a provider asks for, decided by the operator.

A request moves the amount out of the team's earnings into its payout_pending account at
once, so the same money cannot be asked for twice or paid out by the operator's direct
``credits.payout_record`` meanwhile. The operator then either pays it (payout_pending → the
platform's payouts account: the money left the platform) or rejects it with a reason
(payout_pending → earnings, all of it back). While it waits, the provider may cancel it
(payout_pending → earnings as well). Each step is one balanced ledger transfer, keyed by the
request, so a retried step writes nothing twice.

Locks follow the ledger's order (billing/ledger.py): the payout request row first, then the
accounts in primary-key order. A team's accounts are locked before its open request is looked
for, so two requests of one team at once are served one after the other, and the second sees
the first.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from billing import stripe_gateway
from billing.errors import (
    IdempotencyConflict,
    InsufficientEarnings,
    InvalidAmount,
    PaymentProviderError,
    PaymentsUnavailable,
    PayoutConflict,
    PayoutNotFound,
)
from billing.ledger import (
    AccountKey,
    Posting,
    balances_notify,
    lock_accounts,
    postings_write,
    require_amount,
)
from billing.models import (
    AccountKind,
    PayoutDestination,
    PayoutRequest,
    PayoutStatus,
    Transfer,
    TransferKind,
)
from billing.money import MICRO_PER_CENT, format_usd

REASON_MAX = 300


def payout_minimum() -> int:
    return int(settings.BILLING_PAYOUT_MIN)


def payout_validate_amount(amount: int) -> None:
    """Whole cents, at least the minimum (InvalidAmount naming ``amount`` otherwise). Whether
    the earnings cover it is checked under the lock, by ``payout_request_create``."""
    require_amount(amount, allow_zero=True)  # a whole number, not negative
    if amount < payout_minimum() or amount == 0:
        raise InvalidAmount(f"The minimum payout is {format_usd(payout_minimum())}.")
    if amount % MICRO_PER_CENT:
        raise InvalidAmount("Payouts are in whole cents.")


def _earnings_keys(team_id: int) -> tuple[AccountKey, AccountKey]:
    return (team_id, AccountKind.EARNINGS), (team_id, AccountKind.PAYOUT_PENDING)


@transaction.atomic
def payout_request_create(
    *,
    team_id: int,
    amount: int,
    idempotency_key: str = "",
    requested_by_id: int | None = None,
) -> tuple[PayoutRequest, bool]:
    """Ask for ``amount`` of the team's earnings to be paid out. Returns the request and
    whether it is new: a retry with the same key and amount returns the first request and
    writes nothing.

    Refused, writing nothing: an amount under the minimum or not in whole cents (400), more
    than the unpaid earnings (409), or while another request of the team waits (409).
    """
    payout_validate_amount(amount)
    if len(idempotency_key) > 150:
        raise InvalidAmount("Use at most 150 characters.", field="idempotency_key")
    earnings_key, pending_key = _earnings_keys(team_id)
    accounts = lock_accounts([earnings_key, pending_key])
    if idempotency_key:
        earlier = PayoutRequest.objects.filter(
            team_id=team_id, idempotency_key=idempotency_key
        ).first()
        if earlier is not None:
            if earlier.amount != amount:
                raise IdempotencyConflict(
                    "This idempotency key was used for a payout of another amount.",
                    fields={"idempotency_key": ["Used for another payout request."]},
                )
            return earlier, False
    waiting = PayoutRequest.objects.filter(team_id=team_id, status=PayoutStatus.REQUESTED).first()
    if waiting is not None:
        raise PayoutConflict(
            f"A payout of {format_usd(waiting.amount)} is already waiting for approval; ask"
            " for the next one once it is decided.",
            fields={"amount": ["Another payout request is waiting."]},
        )
    earnings = accounts[earnings_key]
    if amount > earnings.balance:
        raise InsufficientEarnings(
            f"You can ask for at most {format_usd(earnings.balance)}, your unpaid earnings.",
            fields={
                "amount": [f"More than your unpaid earnings ({format_usd(earnings.balance)})."]
            },
        )
    # The request first, so its transfer can name it; both or neither are written.
    payout = PayoutRequest.objects.create(
        team_id=team_id,
        amount=amount,
        idempotency_key=idempotency_key,
        requested_by_id=requested_by_id,
    )
    transfer = Transfer(
        kind=TransferKind.PAYOUT_REQUEST,
        idempotency_key=f"payout-request:{payout.pk}",
        team_id=team_id,
        reference=f"payout:{payout.pk}",
        description="Payout requested",
        amount=amount,
        created_by_id=requested_by_id,
        created_at=payout.created_at,
    )
    postings_write([Posting(transfer, [(earnings, -amount), (accounts[pending_key], amount)])])
    payout.request_transfer = transfer
    payout.save(update_fields=["request_transfer"])
    balances_notify([team_id])
    return payout, True


def _decide_lock(payout_id: int) -> PayoutRequest:
    try:
        return PayoutRequest.objects.select_for_update().get(pk=payout_id)
    except PayoutRequest.DoesNotExist as error:
        raise PayoutConflict(f"There is no payout request {payout_id}.") from error


@transaction.atomic
def payout_approve(*, payout_id: int, note: str = "", decided_by_id: int | None) -> PayoutRequest:
    """The operator paid the request (the bank transfer happens elsewhere; ``note`` keeps its
    reference): payout_pending → the platform's payouts account. Approving it again does
    nothing; approving a rejected one is refused."""
    payout = _decide_lock(payout_id)
    if payout.status == PayoutStatus.PAID:
        return payout
    if payout.status != PayoutStatus.REQUESTED:
        raise PayoutConflict(f"This payout request was {payout.status}; it cannot be paid now.")
    pending_key: AccountKey = (payout.team_id, AccountKind.PAYOUT_PENDING)
    payouts_key: AccountKey = (None, AccountKind.PAYOUTS)
    accounts = lock_accounts([pending_key, payouts_key])
    transfer = _decision_transfer(
        payout, TransferKind.PAYOUT, (note or "Payout paid")[:REASON_MAX], decided_by_id
    )
    postings_write(
        [
            Posting(
                transfer,
                [(accounts[pending_key], -payout.amount), (accounts[payouts_key], payout.amount)],
            )
        ]
    )
    return _decided(payout, PayoutStatus.PAID, transfer, decided_by_id, note=note[:REASON_MAX])


@transaction.atomic
def payout_reject(*, payout_id: int, reason: str, decided_by_id: int | None) -> PayoutRequest:
    """The operator refused the request, saying why: all of it goes back to the team's
    earnings. Rejecting it again does nothing; rejecting a paid one is refused."""
    reason = reason.strip()
    if not reason:
        raise InvalidAmount(
            "Say why the payout is rejected; the provider reads it.", field="reason"
        )
    if len(reason) > REASON_MAX:
        raise InvalidAmount(f"Use at most {REASON_MAX} characters.", field="reason")
    payout = _decide_lock(payout_id)
    if payout.status == PayoutStatus.REJECTED:
        return payout
    if payout.status != PayoutStatus.REQUESTED:
        raise PayoutConflict(f"This payout request was {payout.status}; it cannot be rejected now.")
    earnings_key, pending_key = _earnings_keys(payout.team_id)
    accounts = lock_accounts([earnings_key, pending_key])
    transfer = _decision_transfer(
        payout, TransferKind.PAYOUT_REJECT, f"Payout rejected: {reason}"[:REASON_MAX], decided_by_id
    )
    postings_write(
        [
            Posting(
                transfer,
                [(accounts[pending_key], -payout.amount), (accounts[earnings_key], payout.amount)],
            )
        ]
    )
    return _decided(payout, PayoutStatus.REJECTED, transfer, decided_by_id, reason=reason)


@transaction.atomic
def payout_cancel(*, team_id: int, payout_id: int, cancelled_by_id: int | None) -> PayoutRequest:
    """The provider takes back its team's waiting request: all of it goes back to the team's
    earnings, and the request is cancelled, saying who did it and when.

    Cancelling it again does nothing. A request the operator already paid or rejected is
    refused (409, saying which), writing nothing; so is one of another team, as if it did not
    exist (404). The request's row is locked first, so a cancel racing the operator's decision
    waits for it and then sees it."""
    try:
        payout = PayoutRequest.objects.select_for_update().get(pk=payout_id, team_id=team_id)
    except PayoutRequest.DoesNotExist as error:
        raise PayoutNotFound(f"There is no payout request {payout_id} in your team.") from error
    if payout.status == PayoutStatus.CANCELLED:
        return payout
    if payout.status != PayoutStatus.REQUESTED:
        raise PayoutConflict(
            f"This payout request was already {payout.status} by the operator; only a request"
            " that is still waiting can be cancelled."
        )
    earnings_key, pending_key = _earnings_keys(team_id)
    accounts = lock_accounts([earnings_key, pending_key])
    transfer = _decision_transfer(
        payout, TransferKind.PAYOUT_CANCEL, "Payout request cancelled", cancelled_by_id
    )
    postings_write(
        [
            Posting(
                transfer,
                [(accounts[pending_key], -payout.amount), (accounts[earnings_key], payout.amount)],
            )
        ]
    )
    return _decided(payout, PayoutStatus.CANCELLED, transfer, cancelled_by_id)


# --- Stripe Connect: the operator pays through Stripe instead of outside ---------------------


def stripe_connect_enabled() -> bool:
    return bool(settings.STRIPE_SECRET_KEY) and bool(settings.STRIPE_CONNECT_PAYOUTS)


def stripe_destination(team_id: int) -> str | None:
    """The team's connected account, when Connect payouts are on and it has one."""
    if not stripe_connect_enabled():
        return None
    return (
        PayoutDestination.objects.filter(team_id=team_id)
        .values_list("stripe_account_id", flat=True)
        .first()
    )


@transaction.atomic
def payout_pay_with_stripe(*, payout_id: int, decided_by_id: int | None) -> PayoutRequest:
    """Pay a waiting request with a Stripe Connect transfer to the team's connected account,
    then approve it (its note names the transfer).

    The request's row stays locked across Stripe's answer, so nobody rejects it meanwhile;
    Stripe refusing writes nothing. The transfer's idempotency key is the request's, so a
    retry after a lost answer (or a commit that failed after Stripe paid) gets the same
    transfer back from Stripe instead of paying twice.
    """
    payout = _decide_lock(payout_id)
    if payout.status == PayoutStatus.PAID:
        return payout
    if payout.status != PayoutStatus.REQUESTED:
        raise PayoutConflict(f"This payout request was {payout.status}; it cannot be paid now.")
    if not stripe_connect_enabled():
        raise PaymentsUnavailable("Stripe Connect payouts are not configured on this server.")
    destination = stripe_destination(payout.team_id)
    if destination is None:
        raise PayoutConflict(f"{payout.team} has no Stripe account to pay to; set one first.")
    try:
        transfer_id = stripe_gateway.connect_transfer_create(
            amount_cents=payout.amount // MICRO_PER_CENT,  # whole cents (payout_validate_amount)
            currency=settings.BILLING_CURRENCY,
            destination=destination,
            metadata={"payout_request": str(payout.pk), "team": str(payout.team_id)},
            idempotency_key=f"payout-{payout.pk}",
        )
    except stripe_gateway.GatewayError as error:
        raise PaymentProviderError(f"Stripe did not pay it: {error}") from error
    return payout_approve(
        payout_id=payout.pk, note=f"Stripe transfer {transfer_id}", decided_by_id=decided_by_id
    )


def _decision_transfer(
    payout: PayoutRequest, kind: str, description: str, decided_by_id: int | None
) -> Transfer:
    return Transfer(
        kind=kind,
        idempotency_key=f"payout-decision:{payout.pk}",
        team_id=payout.team_id,
        reference=f"payout:{payout.pk}",
        description=description,
        amount=payout.amount,
        created_by_id=decided_by_id,
    )


def _decided(
    payout: PayoutRequest,
    status: str,
    transfer: Transfer,
    decided_by_id: int | None,
    *,
    reason: str = "",
    note: str = "",
) -> PayoutRequest:
    payout.status = status
    payout.decision_transfer = transfer
    payout.decided_by_id = decided_by_id
    payout.decided_at = transfer.created_at
    payout.reason = reason
    payout.note = note
    payout.save(
        update_fields=[
            "status", "decision_transfer", "decided_by", "decided_at", "reason", "note",
        ]
    )  # fmt: skip
    balances_notify([payout.team_id])
    return payout
