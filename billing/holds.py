"""Two-phase credit holds: reserve on rent, add on extend, capture usage, release the rest.

A hold is a TigerBeetle-style pending transfer: it reserves available credit (available →
held); captures take from it what usage costs (held → the provider's earnings, less the
platform fee → platform revenue) and never more than it holds; release returns the rest and
void returns all. Each hold resolves (release or void) at most once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from billing.capture import capture_due
from billing.errors import (
    HoldCaptured,
    HoldClosed,
    HoldNotFound,
    IdempotencyConflict,
    InsufficientCredit,
    InvalidAmount,
)
from billing.ledger import (
    AccountKey,
    Posting,
    balances_notify,
    ensure_team_accounts,
    lock_accounts,
    postings_write,
    require_amount,
    require_idempotency_key,
    transfer_by_key,
)
from billing.models import (
    Account,
    AccountKind,
    Hold,
    HoldStatus,
    Transfer,
    TransferKind,
    UsageKind,
)
from billing.money import format_usd
from billing.pg_bulk import NewTransfer
from core.pg_bulk import bulk_set, insert_models

USAGE_KINDS = frozenset(UsageKind.values)


def platform_fee_percent() -> Fraction:
    """The platform's share of every capture, in percent (settings.PLATFORM_FEE_PERCENT)."""
    value = Fraction(str(getattr(settings, "PLATFORM_FEE_PERCENT", "10")))
    if not 0 <= value < 100:
        raise ImproperlyConfigured("PLATFORM_FEE_PERCENT must be at least 0 and below 100.")
    return value


def _lock_hold(hold_id: int) -> Hold:
    hold = Hold.objects.select_for_update().filter(pk=hold_id).first()
    if hold is None:
        raise HoldNotFound(f"No hold {hold_id}.")
    return hold


def hold_lock_with_accounts(*, hold_id: int) -> Hold:
    """Lock a hold and every account its captures and its release touch, in one round.

    Call it first, inside the transaction, when one transaction captures and then releases a
    hold (a rental's end): locking those accounts in two rounds would hold the renter's held
    account while waiting for their available one, the reverse of ``hold_create``'s order, and
    the two could deadlock. Later locks of the same rows in the transaction do not wait.
    """
    hold = _lock_hold(hold_id)
    hold_settle_accounts_lock(hold)
    return hold


def hold_lock(*, hold_id: int) -> Hold:
    """Lock a hold alone: enough for a transaction that may only capture on it (a capture
    locks its accounts in one round of its own). One that may capture and then release
    locks the accounts with ``hold_settle_accounts_lock`` before either."""
    return _lock_hold(hold_id)


def hold_settle_accounts_lock(hold: Hold) -> None:
    """Lock every account capturing on ``hold`` and releasing it touch, in one round (see
    ``hold_lock_with_accounts``); the hold is locked already."""
    lock_accounts(capture_account_keys([hold]) | {(hold.team_id, AccountKind.AVAILABLE)})


@transaction.atomic
def hold_create(
    *,
    team_id: int,
    provider_team_id: int,
    amount: int,
    reference: str,
    idempotency_key: str,
    description: str = "",
    machine_reference: str = "",
) -> Hold:
    """Reserve ``amount`` of the team's available credit for a rental (available → held).

    Raises InsufficientCredit, writing nothing, when available < amount; available never goes
    below zero, even when many holds race for the same credit (the available account's row
    lock serialises them). Idempotent by key: a repeat returns the first hold.
    """
    require_amount(amount)
    require_idempotency_key(idempotency_key)
    available_key, held_key = (team_id, AccountKind.AVAILABLE), (team_id, AccountKind.HELD)
    ensure_team_accounts({(provider_team_id, AccountKind.EARNINGS)})
    accounts = lock_accounts([available_key, held_key])
    existing = Hold.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        if (existing.team_id, existing.provider_team_id, existing.reference) != (
            team_id,
            provider_team_id,
            reference,
        ):
            raise IdempotencyConflict("This idempotency key was used for another hold.")
        return existing
    available = accounts[available_key]
    if available.balance < amount:
        raise InsufficientCredit(needed=amount, available=available.balance)
    hold = Hold.objects.create(
        team_id=team_id,
        provider_team_id=provider_team_id,
        reference=reference[:120],
        machine_reference=machine_reference[:120],
        description=description[:300],
        idempotency_key=idempotency_key,
        amount=amount,
    )
    postings_write([_hold_posting(hold, accounts)])
    balances_notify([team_id])
    return hold


@dataclass(frozen=True)
class HoldRequest:
    """One hold of ``holds_create_many``: the arguments of ``hold_create``."""

    team_id: int
    provider_team_id: int
    amount: int
    reference: str
    idempotency_key: str
    description: str = ""
    machine_reference: str = ""


@dataclass(frozen=True)
class HoldAccounts:
    """Teams' available and held accounts, locked in this transaction (``hold_accounts_lock``):
    what a batch of holds may take is decided from them before any is written, and
    ``holds_create_many`` posts to them as they are, without reading them again. Nothing else
    in the transaction may post to them in between."""

    accounts: dict[AccountKey, Account]

    def credit_available(self) -> dict[int, int]:
        """Each team's available credit."""
        return {
            team_id: account.balance
            for (team_id, kind), account in self.accounts.items()
            # Every available account has a team (a CHECK constraint); this tells mypy.
            if kind == AccountKind.AVAILABLE and team_id is not None
        }


def hold_accounts_lock(team_ids: Iterable[int]) -> HoldAccounts:
    """Lock the teams' available and held accounts (creating missing ones). The locks are the
    ones ``hold_create`` takes, so holds made after this in the same transaction never wait."""
    ids = set(team_ids)
    return HoldAccounts(
        lock_accounts(
            {
                (team_id, kind)
                for team_id in ids
                for kind in (AccountKind.AVAILABLE, AccountKind.HELD)
            }
        )
    )


# No savepoint of its own: it checks everything before it writes, and its caller (renting)
# rolls its whole transaction back on any error from here, so a savepoint would only cost
# two statements per rent.
@transaction.atomic(savepoint=False)
def holds_create_many(
    requests: list[HoldRequest], *, locked: HoldAccounts | None = None
) -> list[Hold]:
    """Reserve credit for many rentals at once, all or none: ``hold_create`` for a batch, in a
    few statements whatever its size (the platform placing a deployment's replicas).

    Raises InsufficientCredit, writing nothing, when any team's holds together pass its
    available credit. The idempotency keys must be new (a rental's key names its fresh
    instance); a key used before fails the unique constraint rather than returning the old
    hold. ``locked``: the teams' accounts, locked already (one statement fewer per rent).
    """
    if not requests:
        return []
    for request in requests:
        require_amount(request.amount)
        require_idempotency_key(request.idempotency_key)
    team_ids = {request.team_id for request in requests}
    ensure_team_accounts({(request.provider_team_id, AccountKind.EARNINGS) for request in requests})
    keys = {
        (team_id, kind)
        for team_id in team_ids
        for kind in (AccountKind.AVAILABLE, AccountKind.HELD)
    }
    if locked is not None and keys <= set(locked.accounts):
        accounts = locked.accounts
    else:
        accounts = lock_accounts(keys)
    wanted: dict[int, int] = {}
    for request in requests:
        wanted[request.team_id] = wanted.get(request.team_id, 0) + request.amount
    for team_id, amount in sorted(wanted.items()):
        available = accounts[(team_id, AccountKind.AVAILABLE)].balance
        if available < amount:
            raise InsufficientCredit(needed=amount, available=available)
    now = timezone.now()
    holds = [
        Hold(
            team_id=request.team_id,
            provider_team_id=request.provider_team_id,
            reference=request.reference[:120],
            machine_reference=request.machine_reference[:120],
            description=request.description[:300],
            idempotency_key=request.idempotency_key,
            amount=request.amount,
            created_at=now,
        )
        for request in requests
    ]
    insert_models(Hold, holds)
    postings_write([_hold_posting(hold, accounts) for hold in holds])
    balances_notify(team_ids)
    return holds


def _hold_posting(hold: Hold, accounts: dict[AccountKey, Account]) -> Posting:
    """available → held for a new hold (its first transfer)."""
    transfer = NewTransfer(
        kind=TransferKind.HOLD,
        idempotency_key=f"hold:{hold.pk}",
        team_id=hold.team_id,
        reference=hold.reference,
        description=hold.description,
        amount=hold.amount,
        hold_id=hold.pk,
        machine_reference=hold.machine_reference,
        created_at=hold.created_at,
    )
    return Posting(
        transfer,
        [
            (accounts[(hold.team_id, AccountKind.AVAILABLE)], -hold.amount),
            (accounts[(hold.team_id, AccountKind.HELD)], hold.amount),
        ],
    )


@transaction.atomic
def hold_extend(*, hold_id: int, amount: int, idempotency_key: str) -> Hold:
    """Add ``amount`` of available credit to an open hold (a rental's extension).

    InsufficientCredit (nothing written) when available < amount; HoldClosed on a closed hold.
    Idempotent by key.
    """
    require_amount(amount)
    require_idempotency_key(idempotency_key)
    hold = _lock_hold(hold_id)
    key = f"hold_extend:{idempotency_key}"
    available_key, held_key = (
        (hold.team_id, AccountKind.AVAILABLE),
        (hold.team_id, AccountKind.HELD),
    )
    accounts = lock_accounts([available_key, held_key])
    existing = transfer_by_key(key)
    if existing is not None:
        if existing.hold_id != hold.pk or existing.amount != amount:
            raise IdempotencyConflict("This idempotency key was used for another extension.")
        return hold
    if hold.status != HoldStatus.OPEN:
        raise HoldClosed(f"Hold {hold.pk} is {hold.status}; it cannot be extended.")
    available = accounts[available_key]
    if available.balance < amount:
        raise InsufficientCredit(needed=amount, available=available.balance)
    hold.amount += amount
    bulk_set(Hold, ["amount"], [hold])
    transfer = Transfer(
        kind=TransferKind.HOLD_EXTEND,
        idempotency_key=key,
        team_id=hold.team_id,
        reference=hold.reference,
        description=hold.description,
        amount=amount,
        hold=hold,
        machine_reference=hold.machine_reference,
    )
    postings_write([Posting(transfer, [(available, -amount), (accounts[held_key], amount)])])
    balances_notify([hold.team_id])
    return hold


def _capture_amounts(hold: Hold, kind: str, owed_total: int, percent: Fraction) -> tuple[int, int]:
    """(captured now, platform fee within it) for a cumulative ``owed_total`` of ``kind``:
    ``capture.capture_due`` with the other kind owing nothing new."""
    due = capture_due(
        amount=hold.amount,
        captured_gpu=hold.captured_gpu,
        captured_storage=hold.captured_storage,
        released=hold.released,
        owed_gpu=hold.captured_gpu if kind == UsageKind.STORAGE else owed_total,
        owed_storage=owed_total if kind == UsageKind.STORAGE else hold.captured_storage,
        percent=percent,
    )
    return due.amount, due.fee


def _apply_capture(hold: Hold, kind: str, delta: int) -> None:
    if kind == UsageKind.STORAGE:
        hold.captured_storage += delta
    else:
        hold.captured_gpu += delta


def _capture_posting(
    hold: Hold,
    kind: str,
    delta: int,
    fee: int,
    cumulative: int,
    accounts: dict[AccountKey, Account],
    now: datetime,
) -> Posting:
    transfer = Transfer(
        kind=TransferKind.CAPTURE,
        # Cumulative captures only grow, so (hold, kind, new total) names this capture uniquely.
        idempotency_key=f"capture:{hold.pk}:{kind}:{cumulative}",
        team_id=hold.team_id,
        reference=hold.reference,
        amount=delta,
        fee=fee,
        storage_amount=delta if kind == UsageKind.STORAGE else 0,
        hold_id=hold.pk,
        usage_kind=kind,
        machine_reference=hold.machine_reference,
        created_at=now,
    )
    legs = capture_legs(
        held=accounts[(hold.team_id, AccountKind.HELD)],
        earnings=accounts[(hold.provider_team_id, AccountKind.EARNINGS)],
        revenue=accounts[(None, AccountKind.PLATFORM_REVENUE)],
        delta=delta,
        fee=fee,
    )
    return Posting(transfer, legs)


def capture_legs(
    *, held: Account, earnings: Account, revenue: Account, delta: int, fee: int
) -> list[tuple[Account, int]]:
    """A capture's legs: held → the provider's earnings, less the platform fee → revenue.

    When rounding makes the fee the whole (tiny) charge, the net leg would be zero and the
    provider's ledger would not show the charge at all (their earnings pages read it): then
    the gross goes to their earnings and the fee comes back out of it.
    """
    if fee == delta:
        return [(held, -delta), (earnings, delta), (earnings, -fee), (revenue, fee)]
    return [(held, -delta), (earnings, delta - fee), (revenue, fee)]


def capture_account_keys(holds: Iterable[Hold]) -> set[AccountKey]:
    keys: set[AccountKey] = {(None, AccountKind.PLATFORM_REVENUE)}
    for hold in holds:
        keys.add((hold.team_id, AccountKind.HELD))
        keys.add((hold.provider_team_id, AccountKind.EARNINGS))
    return keys


def _require_usage(kind: str, owed_total: int) -> None:
    if kind not in USAGE_KINDS:
        raise InvalidAmount(f"Unknown usage kind {kind!r}; use gpu or storage.", field="kind")
    require_amount(owed_total, field_name="owed_total", allow_zero=True)


@transaction.atomic
def hold_capture_usage(*, hold_id: int, kind: str, owed_total: int) -> int:
    """Capture what is owed for ``kind`` beyond what was already captured; return that amount.

    ``owed_total`` is cumulative, so repeating a call captures nothing twice. Never captures
    more than the hold still holds. Held → provider earnings, less the platform fee → revenue.
    On a closed hold: 0 if nothing new is owed, else HoldClosed.
    """
    _require_usage(kind, owed_total)
    hold = _lock_hold(hold_id)
    if hold.status != HoldStatus.OPEN:
        if owed_total <= hold.captured_for(kind):
            return 0
        raise HoldClosed(f"Hold {hold.pk} is {hold.status}; it takes no more captures.")
    delta, fee = _capture_amounts(hold, kind, owed_total, platform_fee_percent())
    if delta == 0:
        return 0
    accounts = lock_accounts(capture_account_keys([hold]))
    _apply_capture(hold, kind, delta)
    bulk_set(Hold, ["captured_gpu", "captured_storage"], [hold])
    now = timezone.now()
    postings_write(
        [_capture_posting(hold, kind, delta, fee, hold.captured_for(kind), accounts, now)]
    )
    balances_notify([hold.team_id, hold.provider_team_id])
    return delta


@transaction.atomic
def hold_release(*, hold_id: int) -> int:
    """Return what the hold still holds to available and close it; return that amount.

    A hold resolves once: a second call (or a call after void) returns 0 and writes nothing.
    """
    hold = _lock_hold(hold_id)
    if hold.status != HoldStatus.OPEN:
        return 0
    rest = hold.remaining
    held_key, available_key = (
        (hold.team_id, AccountKind.HELD),
        (hold.team_id, AccountKind.AVAILABLE),
    )
    accounts = lock_accounts([held_key, available_key])
    hold.status, hold.released, hold.closed_at = HoldStatus.RELEASED, rest, timezone.now()
    bulk_set(Hold, ["status", "released", "closed_at"], [hold])
    if rest:
        transfer = Transfer(
            kind=TransferKind.RELEASE,
            idempotency_key=f"release:{hold.pk}",
            team_id=hold.team_id,
            reference=hold.reference,
            amount=rest,
            hold=hold,
            machine_reference=hold.machine_reference,
            created_at=hold.closed_at,
        )
        postings_write(
            [Posting(transfer, [(accounts[held_key], -rest), (accounts[available_key], rest)])]
        )
        balances_notify([hold.team_id])
    return rest


@transaction.atomic
def hold_void(*, hold_id: int) -> int:
    """Return all of an uncaptured hold to available and close it; return that amount.

    HoldCaptured (nothing written) if anything was captured — release it instead. A second
    call returns 0 and writes nothing.
    """
    hold = _lock_hold(hold_id)
    if hold.status != HoldStatus.OPEN:
        return 0
    if hold.captured:
        raise HoldCaptured(
            f"Hold {hold.pk} has {format_usd(hold.captured)} captured; release it instead."
        )
    held_key, available_key = (
        (hold.team_id, AccountKind.HELD),
        (hold.team_id, AccountKind.AVAILABLE),
    )
    accounts = lock_accounts([held_key, available_key])
    hold.status, hold.released, hold.closed_at = HoldStatus.VOIDED, hold.amount, timezone.now()
    bulk_set(Hold, ["status", "released", "closed_at"], [hold])
    transfer = Transfer(
        kind=TransferKind.VOID,
        idempotency_key=f"void:{hold.pk}",
        team_id=hold.team_id,
        reference=hold.reference,
        amount=hold.amount,
        hold=hold,
        machine_reference=hold.machine_reference,
        created_at=hold.closed_at,
    )
    postings_write(
        [
            Posting(
                transfer,
                [(accounts[held_key], -hold.amount), (accounts[available_key], hold.amount)],
            )
        ]
    )
    balances_notify([hold.team_id])
    return hold.amount
