"""Every write to the money. Typed, keyword-only, one transaction each.

How each write stays correct under concurrency (the saleor pattern):

1. lock the rows it changes, always in the same order — holds (by pk), then top-ups, then
   accounts (by pk) — so two writers never wait on each other in a cycle;
2. check idempotency keys *after* taking the locks: a concurrent twin of the same call waited on
   the first one's locks and now sees its committed result;
3. compute everything in memory and raise a domain error before writing anything;
4. write the transfer and its entries (which must sum to zero) and the new balances;
5. send events only after commit (``balance_changed``).

The database backs the rules up: CHECK constraints keep non-source balances ≥ 0 and a hold's
captured + released ≤ amount; unique keys make every transfer happen at most once.
"""

from __future__ import annotations

import gc
import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from operator import attrgetter
from typing import NamedTuple

import psycopg
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from billing import stripe_gateway
from billing.errors import (
    HoldCaptured,
    HoldClosed,
    HoldNotFound,
    IdempotencyConflict,
    InsufficientCredit,
    InsufficientEarnings,
    InvalidAmount,
    LedgerError,
    PaymentProviderError,
    PaymentsUnavailable,
)
from billing.models import (
    SOURCE_ACCOUNT_KINDS,
    Account,
    AccountKind,
    ChargeUsage,
    Entry,
    Hold,
    HoldStatus,
    StripeEvent,
    StripeEventStatus,
    TopUp,
    TopUpStatus,
    Transfer,
    TransferKind,
    UsageKind,
)
from billing.money import MICRO_PER_CENT, format_usd, percent_of
from billing.selectors import Balance, team_balance  # noqa: F401  (re-exported for callers)
from billing.signals import balance_changed, topup_credited

logger = logging.getLogger(__name__)

AccountKey = tuple[int | None, str]
USAGE_KINDS = frozenset(UsageKind.values)
# Holds settled per transaction by the metering sweep. Each batch costs a few fixed round
# trips (lock holds, lock accounts, COPY, two UPDATEs, commit), so bigger batches amortise
# them; but a batch holds its holds' and the touched accounts' row locks until it commits
# (about 0.15–0.3 s for 5,000 on a 2-core machine, measured by bench/metering.py), and a
# renter's rent or extend waits on its held account meanwhile.
SETTLE_BATCH_SIZE = 5000


class HoldUsage(NamedTuple):
    """What a rental owes so far on its hold (cumulative micro-dollars per usage kind)."""

    hold_id: int
    gpu: int
    storage: int


def platform_fee_percent() -> Fraction:
    value = Fraction(str(getattr(settings, "PLATFORM_FEE_PERCENT", "10")))
    if not 0 <= value < 100:
        raise ImproperlyConfigured("PLATFORM_FEE_PERCENT must be at least 0 and below 100.")
    return value


def _require_amount(amount: int, *, field_name: str = "amount", allow_zero: bool = False) -> None:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise InvalidAmount(
            f"{field_name} must be an integer number of micro-dollars.", field=field_name
        )
    if amount < 0 or (amount == 0 and not allow_zero):
        raise InvalidAmount(
            f"{field_name} must be {'zero or ' if allow_zero else ''}positive.", field=field_name
        )


def _require_key(key: str) -> None:
    if not key or len(key) > 150:
        raise InvalidAmount(
            "An idempotency key of 1 to 150 characters is required.", field="idempotency_key"
        )


# --- accounts and the posting of transfers ----------------------------------------------


def _bigint_array(values: Iterable[int]) -> str:
    """A bigint[] parameter in PostgreSQL's array text, ``{1,2,3}`` (cast with ::bigint[]).
    psycopg would dump a list item by item in Python: a second of every metering sweep."""
    return "{" + ",".join(map(str, values)) + "}"


def _team_ids_in(team_ids: set[int]):
    """The right-hand side of ``team_id__in``: on PostgreSQL one array parameter, since the
    sweep locks thousands of accounts and a parameter each costs more than the query."""
    if connection.vendor == "postgresql":
        return RawSQL("SELECT unnest(%s::bigint[])", [_bigint_array(sorted(team_ids))])
    return team_ids


def _account_filter(keys: Iterable[AccountKey]) -> Q:
    teams_by_kind: dict[str, set[int | None]] = defaultdict(set)
    for team_id, kind in keys:
        teams_by_kind[kind].add(team_id)
    query = Q(pk__in=[])
    for kind, team_ids in sorted(teams_by_kind.items()):
        if None in team_ids:
            query |= Q(kind=kind, team__isnull=True)
        else:
            query |= Q(kind=kind, team_id__in=_team_ids_in(team_ids))
    return query


def _ensure_accounts(keys: set[AccountKey]) -> None:
    """Create missing accounts; a concurrent creator is absorbed by ON CONFLICT DO NOTHING."""
    existing = set(Account.objects.filter(_account_filter(keys)).values_list("team_id", "kind"))
    missing = keys - existing
    if missing:
        Account.objects.bulk_create(
            [Account(team_id=team_id, kind=kind) for team_id, kind in missing],
            ignore_conflicts=True,
        )


def _lock_accounts(keys: Iterable[AccountKey]) -> dict[AccountKey, Account]:
    """Lock the accounts (creating missing ones) in primary-key order and return them."""
    wanted = set(keys)
    _ensure_accounts(wanted)
    rows = Account.objects.select_for_update().filter(_account_filter(wanted)).order_by("pk")
    found = {(account.team_id, account.kind): account for account in rows}
    if set(found) != wanted:
        raise LedgerError(
            f"Accounts missing after creation: {sorted(wanted - set(found), key=str)}"
        )
    return found


@dataclass(slots=True)
class _NewTransfer:
    """The columns of a Transfer about to be written in bulk: building thousands of model
    instances costs more than writing them. ``_write`` gives it its ``pk``."""

    kind: str
    idempotency_key: str
    team_id: int | None
    reference: str
    amount: int
    fee: int = 0
    storage_amount: int = 0
    hold_id: int | None = None
    usage_kind: str = ""
    machine_reference: str = ""
    description: str = ""
    created_by_id: int | None = None
    created_at: datetime = field(default_factory=timezone.now)
    pk: int | None = None

    def as_model(self) -> Transfer:
        return Transfer(**{name: getattr(self, name) for name, _ in _TRANSFER_COLUMNS})


@dataclass
class _Posting:
    transfer: Transfer | _NewTransfer
    legs: list[tuple[Account, int]] = field(default_factory=list)


def _write(postings: list[_Posting]) -> list[Transfer | _NewTransfer]:
    """Check and write transfers, their entries and the new balances of locked accounts.

    Invariant: every transfer's entries sum to zero and no non-source account ends below zero;
    a violation raises before anything is written.
    """
    touched: dict[int, Account] = {}
    balances: dict[int, int] = {}
    # (account, amount, balance after, transfer) per entry, in posting order.
    entry_rows: list[tuple[Account, int, int, Transfer | _NewTransfer]] = []
    for posting in postings:
        transfer = posting.transfer
        legs = [(account, amount) for account, amount in posting.legs if amount]
        if not legs or sum(amount for _, amount in legs) != 0:
            raise LedgerError(f"Unbalanced transfer {transfer.idempotency_key}.")
        for account, amount in legs:
            account_id = account.id
            after = balances.get(account_id, account.balance) + amount
            if after < 0 and account.kind not in SOURCE_ACCOUNT_KINDS:
                raise LedgerError(f"{account} would go below zero.")
            balances[account_id] = after
            touched[account_id] = account
            entry_rows.append((account, amount, after, transfer))

    transfers = [posting.transfer for posting in postings]
    if connection.vendor == "postgresql" and len(transfers) > 1:
        _insert_transfers_and_entries_pg(transfers, entry_rows)
    else:
        models = [t.as_model() if isinstance(t, _NewTransfer) else t for t in transfers]
        Transfer.objects.bulk_create(models)
        for transfer, model in zip(transfers, models, strict=True):
            transfer.pk = model.pk
        Entry.objects.bulk_create(
            [
                Entry(
                    transfer_id=transfer.pk,
                    account_id=account.pk,
                    team_id=account.team_id,
                    account_kind=account.kind,
                    amount=amount,
                    balance_after=after,
                    created_at=transfer.created_at,
                )
                for account, amount, after, transfer in entry_rows
            ]
        )
    for account_id, account in touched.items():
        account.balance = balances[account_id]
    _bulk_set(Account, ["balance"], list(touched.values()))
    return transfers


_TRANSFER_COLUMNS = [
    ("kind", "text"), ("idempotency_key", "text"), ("team_id", "int8"), ("reference", "text"),
    ("description", "text"), ("amount", "int8"), ("fee", "int8"), ("storage_amount", "int8"),
    ("hold_id", "int8"),
    ("usage_kind", "text"), ("machine_reference", "text"), ("created_by_id", "int8"),
    ("created_at", "timestamptz"),
]  # fmt: skip
_ENTRY_COLUMNS = [
    ("transfer_id", "int8"), ("account_id", "int8"), ("team_id", "int8"),
    ("account_kind", "text"), ("amount", "int8"), ("balance_after", "int8"),
    ("created_at", "timestamptz"),
]  # fmt: skip


def _copy_rows(table: str, columns: list[tuple[str, str]], rows: Iterable[tuple]) -> None:
    """COPY rows into a table: the fast path for big batches (the ORM's bulk_create spends most
    of its time building SQL). Names are constants of this module; values are streamed.

    Binary format: no value is formatted as text and parsed back (3× faster than text COPY
    for the sweep's rows, client and server together); ``columns`` name each column's exact
    type, which binary COPY requires."""
    names = ", ".join(name for name, _ in columns)
    connection.ensure_connection()
    with (
        connection.connection.cursor() as cursor,
        cursor.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types([cast for _, cast in columns])
        for row in rows:
            copy.write_row(row)


def _insert_transfers_and_entries_pg(
    transfers: list[Transfer | _NewTransfer], entry_rows: list[tuple]
) -> None:
    """Transfers get ids from their sequence first, so both tables load with COPY. Every
    entry goes in one COPY statement: the database checks each transfer sums to zero."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence('billing_transfer', 'id')) "
            "FROM generate_series(1, %s)",
            [len(transfers)],
        )
        ids = [row[0] for row in cursor.fetchall()]
    for pk, transfer in zip(ids, transfers, strict=True):
        transfer.pk = pk
        if isinstance(transfer, Transfer):
            transfer._state.adding = False
    columns = attrgetter(*(name for name, _ in _TRANSFER_COLUMNS))
    _copy_rows(
        "billing_transfer",
        [("id", "int8"), *_TRANSFER_COLUMNS],
        ((t.pk, *columns(t)) for t in transfers),
    )
    _copy_rows(
        "billing_entry",
        _ENTRY_COLUMNS,
        (
            (
                transfer.pk,
                account.id,
                account.team_id,
                account.kind,
                amount,
                after,
                transfer.created_at,
            )
            for account, amount, after, transfer in entry_rows
        ),
    )


def _bulk_set(model, fields: list[str], objects: list) -> None:
    """UPDATE many rows' integer columns in one statement (unnest on PostgreSQL)."""
    if not objects:
        return
    if len(objects) == 1:
        obj = objects[0]
        model._base_manager.filter(pk=obj.pk).update(**{f: getattr(obj, f) for f in fields})
        return
    model_fields = [model._meta.get_field(name) for name in fields]
    if connection.vendor != "postgresql" or any(
        f.get_internal_type() != "BigIntegerField" for f in model_fields
    ):
        instances = [
            obj
            if isinstance(obj, model)
            else model(pk=obj.pk, **{f: getattr(obj, f) for f in fields})
            for obj in objects
        ]
        model._base_manager.bulk_update(instances, fields, batch_size=500)
        return
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    columns = [quote(f.column) for f in model_fields]
    sets = ", ".join(f"{column} = v.{column}" for column in columns)
    arrays = ", ".join(["%s::bigint[]"] * (len(columns) + 1))
    names = ", ".join([quote("id"), *columns])
    # Identifiers come from the model's metadata, never from input; values are parameters.
    # The second id condition lets PostgreSQL fetch the rows through the primary key; with the
    # join alone it hashes a scan of the whole table, every batch (a quarter of the sweep).
    sql = (
        f"UPDATE {table} SET {sets} FROM unnest({arrays}) AS v({names})"  # noqa: S608
        f" WHERE {table}.id = v.id AND {table}.id = ANY(%s::bigint[])"
    )
    ids = _bigint_array(obj.pk for obj in objects)
    columns_values = [_bigint_array(getattr(obj, name) for obj in objects) for name in fields]
    params = [ids, *columns_values, ids]
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params)


def _notify(team_ids: Iterable[int]) -> None:
    """Tell subscribers which teams' balances changed, once the transaction commits."""
    ids = sorted({team_id for team_id in team_ids if team_id is not None})
    if not ids:
        return

    def send() -> None:
        for team_id in ids:
            for receiver, result in balance_changed.send_robust(sender=Account, team_id=team_id):
                if isinstance(result, Exception):
                    logger.error("balance_changed receiver %r failed: %r", receiver, result)

    transaction.on_commit(send)


def _existing_transfer(key: str) -> Transfer | None:
    return Transfer.objects.filter(idempotency_key=key).first()


# --- credit in and out -------------------------------------------------------------------


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
    _require_amount(amount)
    _require_key(idempotency_key)
    key = f"grant:{idempotency_key}"
    accounts = _lock_accounts([(team_id, AccountKind.AVAILABLE), (None, AccountKind.GRANTS)])
    existing = _existing_transfer(key)
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
    _write(
        [
            _Posting(
                transfer,
                [
                    (accounts[(None, AccountKind.GRANTS)], -amount),
                    (accounts[(team_id, AccountKind.AVAILABLE)], amount),
                ],
            )
        ]
    )
    _notify([team_id])
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
    _require_amount(amount)
    _require_key(idempotency_key)
    key = f"payout:{idempotency_key}"
    earnings_key = (provider_team_id, AccountKind.EARNINGS)
    accounts = _lock_accounts([earnings_key, (None, AccountKind.PAYOUTS)])
    existing = _existing_transfer(key)
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
    _write(
        [_Posting(transfer, [(earnings, -amount), (accounts[(None, AccountKind.PAYOUTS)], amount)])]
    )
    _notify([provider_team_id])
    return transfer


# --- holds ---------------------------------------------------------------------------------


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
    _lock_accounts(_capture_account_keys([hold]) | {(hold.team_id, AccountKind.AVAILABLE)})
    return hold


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
    _require_amount(amount)
    _require_key(idempotency_key)
    available_key, held_key = (team_id, AccountKind.AVAILABLE), (team_id, AccountKind.HELD)
    _ensure_accounts({(provider_team_id, AccountKind.EARNINGS)})
    accounts = _lock_accounts([available_key, held_key])
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
    transfer = Transfer(
        kind=TransferKind.HOLD,
        idempotency_key=f"hold:{hold.pk}",
        team_id=team_id,
        reference=hold.reference,
        description=hold.description,
        amount=amount,
        hold=hold,
        machine_reference=hold.machine_reference,
        created_at=hold.created_at,
    )
    _write([_Posting(transfer, [(available, -amount), (accounts[held_key], amount)])])
    _notify([team_id])
    return hold


@transaction.atomic
def hold_extend(*, hold_id: int, amount: int, idempotency_key: str) -> Hold:
    """Add ``amount`` of available credit to an open hold (a rental's extension).

    InsufficientCredit (nothing written) when available < amount; HoldClosed on a closed hold.
    Idempotent by key.
    """
    _require_amount(amount)
    _require_key(idempotency_key)
    hold = _lock_hold(hold_id)
    key = f"hold_extend:{idempotency_key}"
    available_key, held_key = (
        (hold.team_id, AccountKind.AVAILABLE),
        (hold.team_id, AccountKind.HELD),
    )
    accounts = _lock_accounts([available_key, held_key])
    existing = _existing_transfer(key)
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
    _bulk_set(Hold, ["amount"], [hold])
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
    _write([_Posting(transfer, [(available, -amount), (accounts[held_key], amount)])])
    _notify([hold.team_id])
    return hold


def _capture_amounts(hold: Hold, kind: str, owed_total: int, percent: Fraction) -> tuple[int, int]:
    """(captured now, platform fee within it) for a cumulative ``owed_total`` of ``kind``.

    Only the difference from what was already captured for the kind, capped at what the hold
    still holds. The fee is computed on the hold's cumulative captures and differenced too, so
    its rounding never accumulates either.
    """
    delta = min(owed_total - hold.captured_for(kind), hold.remaining)
    if delta <= 0:
        return 0, 0
    fee = percent_of(hold.captured + delta, percent) - percent_of(hold.captured, percent)
    return delta, fee


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
    now,
) -> _Posting:
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
    legs = _capture_legs(
        held=accounts[(hold.team_id, AccountKind.HELD)],
        earnings=accounts[(hold.provider_team_id, AccountKind.EARNINGS)],
        revenue=accounts[(None, AccountKind.PLATFORM_REVENUE)],
        delta=delta,
        fee=fee,
    )
    return _Posting(transfer, legs)


def _capture_legs(
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


def _capture_account_keys(holds: Iterable[Hold]) -> set[AccountKey]:
    keys: set[AccountKey] = {(None, AccountKind.PLATFORM_REVENUE)}
    for hold in holds:
        keys.add((hold.team_id, AccountKind.HELD))
        keys.add((hold.provider_team_id, AccountKind.EARNINGS))
    return keys


def _require_usage(kind: str, owed_total: int) -> None:
    if kind not in USAGE_KINDS:
        raise InvalidAmount(f"Unknown usage kind {kind!r}; use gpu or storage.", field="kind")
    _require_amount(owed_total, field_name="owed_total", allow_zero=True)


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
    accounts = _lock_accounts(_capture_account_keys([hold]))
    _apply_capture(hold, kind, delta)
    _bulk_set(Hold, ["captured_gpu", "captured_storage"], [hold])
    now = timezone.now()
    _write([_capture_posting(hold, kind, delta, fee, hold.captured_for(kind), accounts, now)])
    _notify([hold.team_id, hold.provider_team_id])
    return delta


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk job such as the metering sweep.

    A sweep allocates hundreds of thousands of small objects that live until their batch
    commits, and each full collection rescans them along with everything else the worker
    holds: about 0.1 s twenty times a sweep, 40% of its Python time (bench/metering.py). They
    form no reference cycles, so reference counting still frees them; the collector resumes
    afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def holds_settle_usage(usage: Iterable[HoldUsage]) -> int:
    """The metering sweep: capture cumulative usage for many holds; return the total captured.

    Per hold the rule of ``hold_capture_usage`` for each kind — the difference between what is
    owed so far and what was captured, GPU time first, never more than the hold still holds —
    but posted as **one** capture covering both kinds: ``usage_kind`` says which kinds it
    charges ("gpu", "storage" or "gpu+storage") and ``storage_amount`` how much of it is
    storage. The platform fee is differenced on the hold's cumulative captures, so its
    rounding never accumulates. Batches of ``SETTLE_BATCH_SIZE`` holds, each one transaction
    (holds locked in pk order, then accounts in pk order; every write in bulk). Closed or
    unknown holds are skipped. A repeated call, or a sweep that stopped half-way and runs
    again, captures nothing twice: captures are differences of cumulative totals. A hold
    listed twice counts with the larger total of each kind.
    """
    owed: dict[int, tuple[int, int]] = {}
    for hold_id, gpu, storage in usage:
        _require_amount(gpu, field_name="gpu", allow_zero=True)
        _require_amount(storage, field_name="storage", allow_zero=True)
        if hold_id in owed:
            gpu, storage = max(gpu, owed[hold_id][0]), max(storage, owed[hold_id][1])
        owed[hold_id] = (gpu, storage)
    hold_ids = sorted(owed)
    total = 0
    with cyclic_gc_paused():
        for start in range(0, len(hold_ids), SETTLE_BATCH_SIZE):
            total += _settle_batch(hold_ids[start : start + SETTLE_BATCH_SIZE], owed)
    return total


_SWEPT_HOLD_COLUMNS = (
    "id", "team_id", "provider_team_id", "reference", "machine_reference", "amount",
    "captured_gpu", "captured_storage", "released",
)  # fmt: skip


def _lock_open_holds(hold_ids: list[int]) -> list[tuple]:
    """Lock the open holds among ``hold_ids`` in primary-key order; rows of
    ``_SWEPT_HOLD_COLUMNS``. On PostgreSQL the ids go as one array parameter (an IN list of
    thousands of parameters costs more to build than the query costs to run)."""
    if connection.vendor != "postgresql":
        return list(
            Hold.objects.select_for_update()
            .filter(pk__in=hold_ids, status=HoldStatus.OPEN)
            .order_by("pk")
            .values_list(*_SWEPT_HOLD_COLUMNS)
        )
    # Column names are the constants above; values are parameters.
    sql = (
        f"SELECT {', '.join(_SWEPT_HOLD_COLUMNS)} FROM billing_hold"  # noqa: S608
        " WHERE id = ANY(%s::bigint[]) AND status = %s ORDER BY id FOR UPDATE"
    )
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, [_bigint_array(hold_ids), HoldStatus.OPEN.value])
        return cursor.fetchall()


class _SweptHold:
    """What the sweep reads and changes of a locked hold (no model instance per hold)."""

    __slots__ = ("pk", "captured_gpu", "captured_storage")

    def __init__(self, pk: int, captured_gpu: int, captured_storage: int) -> None:
        self.pk, self.captured_gpu, self.captured_storage = pk, captured_gpu, captured_storage


def _usage_and_key(pk: int, gpu_delta: int, storage_delta: int, gpu: int, storage: int):
    """(usage_kind, idempotency key) of a sweep capture that brings the hold's cumulative
    captures to ``gpu`` and ``storage``. Cumulative captures only grow, so the new totals name
    the capture uniquely, and a single-kind capture gets the same key as hold_capture_usage."""
    if not storage_delta:
        return ChargeUsage.GPU, f"capture:{pk}:gpu:{gpu}"
    if not gpu_delta:
        return ChargeUsage.STORAGE, f"capture:{pk}:storage:{storage}"
    return ChargeUsage.GPU_AND_STORAGE, f"capture:{pk}:gpu:{gpu}:storage:{storage}"


@transaction.atomic
def _settle_batch(hold_ids: list[int], owed: dict[int, tuple[int, int]]) -> int:
    """One transaction: lock the batch's open holds, then the accounts; post one capture per
    hold that owes anything, covering both kinds (``storage_amount`` is the storage part)."""
    rows = _lock_open_holds(hold_ids)
    percent = platform_fee_percent()
    # (hold row, GPU captured now, storage captured now, fee)
    plans: list[tuple[tuple, int, int, int]] = []
    for row in rows:
        pk, _, _, _, _, amount, gpu, storage, released = row
        gpu_owed, storage_owed = owed[pk]
        # As _capture_amounts, GPU first: each kind captures the difference of cumulative
        # totals, capped at what the hold still holds.
        remaining = amount - gpu - storage - released
        gpu_delta = max(0, min(gpu_owed - gpu, remaining))
        storage_delta = max(0, min(storage_owed - storage, remaining - gpu_delta))
        if gpu_delta or storage_delta:
            # The fee is differenced on the hold's cumulative captures: no rounding drift.
            before = gpu + storage
            after = before + gpu_delta + storage_delta
            fee = percent_of(after, percent) - percent_of(before, percent)
            plans.append((row, gpu_delta, storage_delta, fee))
    if not plans:
        return 0
    keys: set[AccountKey] = {(None, AccountKind.PLATFORM_REVENUE)}
    for row, *_ in plans:
        keys.add((row[1], AccountKind.HELD))
        keys.add((row[2], AccountKind.EARNINGS))
    accounts = _lock_accounts(keys)
    revenue = accounts[(None, AccountKind.PLATFORM_REVENUE)]
    now = timezone.now()
    postings = []
    changed = []
    for row, gpu_delta, storage_delta, fee in plans:
        pk, team_id, provider_id, reference, machine, _, gpu, storage, _ = row
        gpu, storage = gpu + gpu_delta, storage + storage_delta
        delta = gpu_delta + storage_delta
        usage, key = _usage_and_key(pk, gpu_delta, storage_delta, gpu, storage)
        transfer = _NewTransfer(
            kind=TransferKind.CAPTURE,
            idempotency_key=key,
            team_id=team_id,
            reference=reference,
            amount=delta,
            fee=fee,
            storage_amount=storage_delta,
            hold_id=pk,
            usage_kind=usage,
            machine_reference=machine,
            created_at=now,
        )
        legs = _capture_legs(
            held=accounts[(team_id, AccountKind.HELD)],
            earnings=accounts[(provider_id, AccountKind.EARNINGS)],
            revenue=revenue,
            delta=delta,
            fee=fee,
        )
        postings.append(_Posting(transfer, legs))
        changed.append(_SweptHold(pk, gpu, storage))
    _bulk_set(Hold, ["captured_gpu", "captured_storage"], changed)
    _write(postings)
    _notify({row[1] for row, *_ in plans} | {row[2] for row, *_ in plans})
    return sum(gpu_delta + storage_delta for _, gpu_delta, storage_delta, _ in plans)


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
    accounts = _lock_accounts([held_key, available_key])
    hold.status, hold.released, hold.closed_at = HoldStatus.RELEASED, rest, timezone.now()
    _bulk_set(Hold, ["status", "released", "closed_at"], [hold])
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
        _write([_Posting(transfer, [(accounts[held_key], -rest), (accounts[available_key], rest)])])
        _notify([hold.team_id])
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
    accounts = _lock_accounts([held_key, available_key])
    hold.status, hold.released, hold.closed_at = HoldStatus.VOIDED, hold.amount, timezone.now()
    _bulk_set(Hold, ["status", "released", "closed_at"], [hold])
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
    _write(
        [
            _Posting(
                transfer,
                [(accounts[held_key], -hold.amount), (accounts[available_key], hold.amount)],
            )
        ]
    )
    _notify([hold.team_id])
    return hold.amount


# --- Stripe top-ups ------------------------------------------------------------------------


def topup_limits() -> tuple[int, int]:
    return settings.BILLING_TOPUP_MIN, settings.BILLING_TOPUP_MAX


def topup_validate_amount(amount: int) -> None:
    """Whole cents, within the configured minimum and maximum (InvalidAmount otherwise)."""
    _require_amount(amount)
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


def stripe_event_process(*, payload: dict) -> StripeEventResult:
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


def _stripe_event_dispatch(event_type: str, payload: dict) -> str:
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


def _topup_for_session(session: dict) -> TopUp:
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


def _topup_mark(session: dict, status: str, reason: str) -> str:
    topup = _topup_for_session(session)
    if topup.status == TopUpStatus.PAID:
        return f"Top-up {topup.pk} is already credited; {status} ignored."
    TopUp.objects.filter(pk=topup.pk).update(
        status=status,
        failure_reason=reason if status != TopUpStatus.PROCESSING else "",
        checkout_session_id=topup.checkout_session_id or session.get("id"),
    )
    return f"Top-up {topup.pk} is {status}."


def _topup_credit(session: dict) -> str:
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
    accounts = _lock_accounts([available_key, (None, AccountKind.STRIPE_CLEARING)])
    transfer = Transfer(
        kind=TransferKind.TOPUP,
        idempotency_key=f"topup:{topup.pk}",
        team_id=topup.team_id,
        reference=f"topup:{topup.pk}",
        description=f"Card payment (Stripe {session.get('id', '')})"[:300],
        amount=amount,
        created_by_id=topup.created_by_id,
    )
    _write(
        [
            _Posting(
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
    _notify([topup.team_id])
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
