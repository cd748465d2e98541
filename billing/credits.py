"""Credit that enters or leaves the platform outside rentals and card top-ups: operator
grants into a team's balance, payouts of a provider's earnings, and credit a team sends
another."""

from __future__ import annotations

from django.db import transaction

from billing.errors import (
    IdempotencyConflict,
    InsufficientCredit,
    InsufficientEarnings,
    InvalidAmount,
)
from billing.ledger import (
    Posting,
    balances_notify,
    lock_accounts,
    postings_write,
    require_amount,
    require_idempotency_key,
    transfer_by_key,
)
from billing.models import AccountKind, Transfer, TransferKind
from billing.money import format_usd


@transaction.atomic
def credit_grant(
    *,
    team_id: int,
    amount: int,
    reason: str,
    idempotency_key: str,
    created_by_id: int | None = None,
) -> Transfer:
    """Give a team credit (operators, demo, tests): grants → the team's available balance.

    Idempotent by key: a repeated call returns the first transfer and credits nothing.
    """
    require_amount(amount)
    require_idempotency_key(idempotency_key)
    key = f"grant:{idempotency_key}"
    accounts = lock_accounts([(team_id, AccountKind.AVAILABLE), (None, AccountKind.GRANTS)])
    existing = transfer_by_key(key)
    if existing is not None:
        if existing.team_id != team_id or existing.amount != amount:
            raise IdempotencyConflict("This idempotency key was used for another grant.")
        return existing
    transfer = Transfer(
        kind=TransferKind.GRANT,
        idempotency_key=key,
        team_id=team_id,
        reference=f"grant:{idempotency_key}"[:120],
        description=(reason or "Credit grant")[:300],
        amount=amount,
        created_by_id=created_by_id,
    )
    postings_write(
        [
            Posting(
                transfer,
                [
                    (accounts[(None, AccountKind.GRANTS)], -amount),
                    (accounts[(team_id, AccountKind.AVAILABLE)], amount),
                ],
            )
        ]
    )
    balances_notify([team_id])
    return transfer


@transaction.atomic
def payout_record(
    *,
    provider_team_id: int,
    amount: int,
    idempotency_key: str,
    note: str,
    created_by_id: int | None = None,
) -> Transfer:
    """Record money paid out to a provider (operator-triggered): earnings → payouts.

    Never pays out more than the provider has earned; idempotent by key.
    """
    require_amount(amount)
    require_idempotency_key(idempotency_key)
    key = f"payout:{idempotency_key}"
    earnings_key = (provider_team_id, AccountKind.EARNINGS)
    accounts = lock_accounts([earnings_key, (None, AccountKind.PAYOUTS)])
    existing = transfer_by_key(key)
    if existing is not None:
        if existing.team_id != provider_team_id or existing.amount != amount:
            raise IdempotencyConflict("This idempotency key was used for another payout.")
        return existing
    earnings = accounts[earnings_key]
    if earnings.balance < amount:
        raise InsufficientEarnings(
            f"Cannot pay out {format_usd(amount)}: the provider has {format_usd(earnings.balance)}"
            " of earnings.",
            fields={"amount": ["More than the provider's earnings."]},
        )
    transfer = Transfer(
        kind=TransferKind.PAYOUT,
        idempotency_key=key,
        team_id=provider_team_id,
        reference=f"payout:{idempotency_key}"[:120],
        description=(note or "Payout")[:300],
        amount=amount,
        created_by_id=created_by_id,
    )
    postings_write(
        [Posting(transfer, [(earnings, -amount), (accounts[(None, AccountKind.PAYOUTS)], amount)])]
    )
    balances_notify([provider_team_id])
    return transfer


@transaction.atomic
def credit_transfer(
    *,
    from_team_id: int,
    to_team_id: int,
    amount: int,
    idempotency_key: str,
    created_by_id: int | None = None,
) -> Transfer:
    """Move available credit from one team to another: the sender's available balance → the
    recipient's. Never more than the sender has available (held credit stays held); who may
    send, and to whom, is the caller's check.

    Idempotent by key (scoped to the sender): a repeated call returns the first transfer and
    moves nothing; the same key for another transfer is refused.
    """
    require_amount(amount)
    require_idempotency_key(idempotency_key)
    if from_team_id == to_team_id:
        raise InvalidAmount("A team cannot send credit to itself.", field="recipient")
    key = f"team-transfer:{from_team_id}:{idempotency_key}"
    sender_key, recipient_key = (
        (from_team_id, AccountKind.AVAILABLE),
        (
            to_team_id,
            AccountKind.AVAILABLE,
        ),
    )
    accounts = lock_accounts([sender_key, recipient_key])
    existing = transfer_by_key(key)
    if existing is not None:
        if existing.amount != amount or existing.reference != f"team:{to_team_id}":
            raise IdempotencyConflict("This idempotency key was used for another transfer.")
        return existing
    sender = accounts[sender_key]
    if sender.balance < amount:
        raise InsufficientCredit(needed=amount, available=sender.balance)
    transfer = Transfer(
        kind=TransferKind.TEAM_TRANSFER,
        idempotency_key=key,
        team_id=from_team_id,
        reference=f"team:{to_team_id}",
        description=f"Credit sent to team {to_team_id}",
        amount=amount,
        created_by_id=created_by_id,
    )
    postings_write([Posting(transfer, [(sender, -amount), (accounts[recipient_key], amount)])])
    balances_notify([from_team_id, to_team_id])
    return transfer
