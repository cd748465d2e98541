"""The double-entry ledger: accounts, the posting of transfers, idempotency, balance events.

Every write to the money (``credits``, ``holds``, ``metering``, ``topups``, ``payouts``) is
built from these pieces and stays correct under concurrency the same way (the saleor pattern):

1. lock the rows it changes, always in the same order — holds (by pk), then top-ups, then
   payout requests, then accounts (by pk) — so two writers never wait on each other in a
   cycle;
2. check idempotency keys *after* taking the locks: a concurrent twin of the same call waited on
   the first one's locks and now sees its committed result;
3. compute everything in memory and raise a domain error before writing anything;
4. write the transfer and its entries (which must sum to zero) and the new balances;
5. send events only after commit (``balance_changed``).

The database backs the rules up: CHECK constraints keep non-source balances ≥ 0 and a hold's
captured + released ≤ amount; unique keys make every transfer happen at most once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from django.db import transaction
from django.db.models import Q

from billing.errors import InvalidAmount, LedgerError
from billing.models import SOURCE_ACCOUNT_KINDS, Account, Transfer
from billing.pg_bulk import EntryRow, NewTransfer, insert_transfers_and_entries
from billing.signals import balance_changed
from core.pg_bulk import bulk_set, ids_in

logger = logging.getLogger(__name__)

AccountKey = tuple[int | None, str]


def require_amount(amount: int, *, field_name: str = "amount", allow_zero: bool = False) -> None:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise InvalidAmount(
            f"{field_name} must be an integer number of micro-dollars.", field=field_name
        )
    if amount < 0 or (amount == 0 and not allow_zero):
        raise InvalidAmount(
            f"{field_name} must be {'zero or ' if allow_zero else ''}positive.", field=field_name
        )


def require_idempotency_key(key: str) -> None:
    if not key or len(key) > 150:
        raise InvalidAmount(
            "An idempotency key of 1 to 150 characters is required.", field="idempotency_key"
        )


def _account_filter(keys: Iterable[AccountKey]) -> Q:
    teams_by_kind: dict[str, set[int | None]] = defaultdict(set)
    for team_id, kind in keys:
        teams_by_kind[kind].add(team_id)
    query = Q(pk__in=[])
    for kind, team_ids in sorted(teams_by_kind.items()):
        if None in team_ids:
            query |= Q(kind=kind, team__isnull=True)
        else:
            # None is not among them (checked above).
            query |= Q(kind=kind, team_id__in=ids_in(cast("set[int]", team_ids)))
    return query


def ensure_accounts(keys: set[AccountKey]) -> None:
    """Create missing accounts; a concurrent creator is absorbed by ON CONFLICT DO NOTHING."""
    existing = set(Account.objects.filter(_account_filter(keys)).values_list("team_id", "kind"))
    missing = keys - existing
    if missing:
        Account.objects.bulk_create(
            [Account(team_id=team_id, kind=kind) for team_id, kind in missing],
            ignore_conflicts=True,
        )


# Team accounts this process has seen committed. An account row is never deleted (a trigger
# refuses) and team ids are never reused, so ``ensure_team_accounts`` need not look for one
# again: each batch of rents looked up its providers' earnings accounts, a statement and its
# ORM every time. Only what a commit made durable is remembered (a creation rolled back is
# looked for again), and accounts of no team are left out: the tests' flush empties the
# tables, and the platform's accounts are the same keys afterwards.
_teams_accounts_seen: set[AccountKey] = set()
_SEEN_AT_MOST = 200_000


def ensure_team_accounts(keys: set[AccountKey]) -> None:
    """``ensure_accounts`` for teams' accounts, skipping those already seen committed."""
    unseen = {key for key in keys if key not in _teams_accounts_seen}
    if not unseen:
        return
    if any(team_id is None for team_id, _ in unseen):
        raise ValueError("ensure_team_accounts is for teams' accounts; use ensure_accounts")
    ensure_accounts(unseen)
    transaction.on_commit(lambda: _seen_committed(unseen))


def _seen_committed(keys: set[AccountKey]) -> None:
    if len(_teams_accounts_seen) > _SEEN_AT_MOST:  # bounded: a process serving many teams
        _teams_accounts_seen.clear()
    _teams_accounts_seen.update(keys)


def lock_accounts(keys: Iterable[AccountKey]) -> dict[AccountKey, Account]:
    """Lock the accounts (creating missing ones) in primary-key order and return them."""
    wanted = set(keys)
    # Lock first and create only what is missing (rare: a team's first hold or top-up), so
    # the common case is one statement. Creating takes no lock on existing rows, and the
    # second pass locks everything again in primary-key order (rows already locked by this
    # transaction do not wait).
    rows = Account.objects.select_for_update().filter(_account_filter(wanted)).order_by("pk")
    found = {(account.team_id, account.kind): account for account in rows}
    if set(found) != wanted:
        ensure_accounts(wanted - set(found))
        rows = Account.objects.select_for_update().filter(_account_filter(wanted)).order_by("pk")
        found = {(account.team_id, account.kind): account for account in rows}
    if set(found) != wanted:
        raise LedgerError(
            f"Accounts missing after creation: {sorted(wanted - set(found), key=str)}"
        )
    return found


@dataclass
class Posting:
    """A transfer and its legs (account, signed amount) on locked accounts."""

    transfer: Transfer | NewTransfer
    legs: list[tuple[Account, int]] = field(default_factory=list)


def postings_write(postings: list[Posting]) -> list[Transfer | NewTransfer]:
    """Check and write transfers, their entries and the new balances of locked accounts.

    Invariant: every transfer's entries sum to zero and no non-source account ends below zero;
    a violation raises before anything is written.
    """
    touched: dict[int, Account] = {}
    balances: dict[int, int] = {}
    entry_rows: list[EntryRow] = []  # in posting order
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
    insert_transfers_and_entries(transfers, entry_rows)
    for account_id, account in touched.items():
        account.balance = balances[account_id]
    bulk_set(Account, ["balance"], list(touched.values()))
    return transfers


def balances_notify(team_ids: Iterable[int | None]) -> None:
    """Tell subscribers which teams' balances changed, once the transaction commits."""
    ids = sorted({team_id for team_id in team_ids if team_id is not None})
    if not ids:
        return

    def send() -> None:
        for receiver, result in balance_changed.send_robust(sender=Account, team_ids=ids):
            if isinstance(result, Exception):
                logger.error("balance_changed receiver %r failed: %r", receiver, result)

    transaction.on_commit(send)


def transfer_by_key(key: str) -> Transfer | None:
    """The transfer already written under an idempotency key, if any."""
    return Transfer.objects.filter(idempotency_key=key).first()
