"""Whole-ledger invariant checks shared by the billing tests (read-only SQL over everything).

A handful of queries however big the ledger is, so the state-machine test can run them after
every step of hundreds of examples. Plain SQL that PostgreSQL and SQLite both speak: the money
tests run on both (scripts/test.sh).
"""

from __future__ import annotations

from django.db import connection, transaction

from billing.models import (
    SOURCE_ACCOUNT_KINDS,
    Account,
    AccountKind,
    ChargeUsage,
    Entry,
    Hold,
    HoldStatus,
    PayoutRequest,
    PayoutStatus,
    Transfer,
    TransferKind,
)
from billing.selectors import Balance, team_balance


def _rows(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def assert_ledger_consistent() -> None:
    # Every transfer's entries sum to zero, every transfer has entries, every entry an account.
    assert (
        _rows("SELECT transfer_id FROM billing_entry GROUP BY transfer_id HAVING sum(amount) <> 0")
        == []
    )
    assert (
        _rows(
            "SELECT id FROM billing_transfer t"
            " WHERE NOT EXISTS (SELECT 1 FROM billing_entry e WHERE e.transfer_id = t.id)"
        )
        == []
    )
    assert (
        _rows(
            "SELECT id FROM billing_entry e"
            " WHERE NOT EXISTS (SELECT 1 FROM billing_account a WHERE a.id = e.account_id)"
        )
        == []
    )

    # Each account's balance is the sum of its entries and its last entry's balance_after;
    # only the sources of credit run negative.
    totals: dict[str, int] = {}
    held_accounts: dict[int, int] = {}
    pending_accounts: dict[int, int] = {}
    accounts = _rows(
        "SELECT a.id, a.team_id, a.kind, a.balance,"
        " (SELECT coalesce(sum(e.amount), 0) FROM billing_entry e WHERE e.account_id = a.id),"
        " (SELECT e.balance_after FROM billing_entry e WHERE e.account_id = a.id"
        "  ORDER BY e.id DESC LIMIT 1)"
        " FROM billing_account a"
    )
    for pk, team_id, kind, balance, entries_sum, last_after in accounts:
        assert balance == entries_sum, (pk, kind, balance, entries_sum)
        if last_after is not None:
            assert last_after == balance, (pk, kind, balance, last_after)
        if kind not in SOURCE_ACCOUNT_KINDS:
            assert balance >= 0, (pk, kind, balance)
        totals[kind] = totals.get(kind, 0) + balance
        if kind == AccountKind.HELD:
            held_accounts[team_id] = balance
        if kind == AccountKind.PAYOUT_PENDING:
            pending_accounts[team_id] = balance

    # Per hold, its usage charges add up to what it captured of each kind. A "gpu" charge is
    # all GPU time, a "storage" charge all storage, and a "gpu+storage" charge (the metering
    # sweep's) has both, its storage_amount being the storage part.
    captured: dict[int, list[int]] = {}
    charges = Transfer.objects.filter(kind=TransferKind.CAPTURE).values_list(
        "pk", "hold_id", "usage_kind", "amount", "storage_amount"
    )
    for pk, hold_id, usage_kind, amount, storage_amount in charges:
        assert hold_id is not None, pk
        if usage_kind == ChargeUsage.GPU:
            assert storage_amount == 0, pk
        elif usage_kind == ChargeUsage.STORAGE:
            assert storage_amount == amount, pk
        else:
            assert usage_kind == ChargeUsage.GPU_AND_STORAGE, pk
            assert 0 < storage_amount < amount, pk
        parts = captured.setdefault(hold_id, [0, 0])
        parts[0] += amount - storage_amount
        parts[1] += storage_amount

    # Holds: never over-resolved; closed holds fully resolved; the held account of each team
    # is exactly what its open holds still hold.
    held_by_team: dict[int, int] = {}
    holds = Hold.objects.values_list(
        "pk", "team_id", "status", "amount", "captured_gpu", "captured_storage", "released"
    )
    for pk, team_id, status, amount, gpu, storage, released in holds:
        assert [gpu, storage] == captured.get(pk, [0, 0]), pk
        assert amount >= gpu + storage + released, pk
        if status == HoldStatus.OPEN:
            held_by_team[team_id] = held_by_team.get(team_id, 0) + amount - gpu - storage
        else:
            assert amount == gpu + storage + released, pk
    for team_id, balance in held_accounts.items():
        assert balance == held_by_team.get(team_id, 0), (team_id, balance)
    assert all(team_id in held_accounts for team_id, held in held_by_team.items() if held)

    # Payout requests: each team's payout_pending account is exactly what its waiting request
    # asks for; every request has its transfer, and every decided one (paid, rejected,
    # cancelled) its decision's.
    waiting_by_team: dict[int, int] = {}
    requests = PayoutRequest.objects.values_list(
        "pk", "team_id", "status", "amount", "request_transfer__amount", "decision_transfer__kind"
    )
    decision_kinds = {
        PayoutStatus.PAID: TransferKind.PAYOUT,
        PayoutStatus.REJECTED: TransferKind.PAYOUT_REJECT,
        PayoutStatus.CANCELLED: TransferKind.PAYOUT_CANCEL,
    }
    for pk, team_id, status, amount, requested, decision_kind in requests:
        assert requested == amount, pk
        if status == PayoutStatus.REQUESTED:
            waiting_by_team[team_id] = waiting_by_team.get(team_id, 0) + amount
        else:
            assert decision_kind == decision_kinds[status], pk
    for team_id in set(pending_accounts) | set(waiting_by_team):
        assert pending_accounts.get(team_id, 0) == waiting_by_team.get(team_id, 0), team_id

    # Conservation: credit that came in = balances + earnings + revenue + payouts.
    credit_in = -sum(totals.get(kind, 0) for kind in SOURCE_ACCOUNT_KINDS)
    held_somewhere = sum(
        totals.get(kind, 0)
        for kind in (
            AccountKind.AVAILABLE,
            AccountKind.HELD,
            AccountKind.EARNINGS,
            AccountKind.PAYOUT_PENDING,
            AccountKind.PLATFORM_REVENUE,
            AccountKind.PAYOUTS,
        )
    )
    assert credit_in == held_somewhere


def ledger_counts() -> tuple[int, int, int, list, list]:
    """A snapshot to prove that a failed operation wrote nothing."""
    return (
        Transfer.objects.count(),
        Entry.objects.count(),
        Hold.objects.count(),
        list(Account.objects.order_by("pk").values_list("pk", "balance")),
        list(PayoutRequest.objects.order_by("pk").values()),
    )


def holds_and_balance(hold_ids, team_id: int) -> tuple[dict[int, Hold], Balance]:
    """Holds and their team's balance read in one snapshot, so a metering sweep that commits
    between two reads cannot make them disagree (a sweep moves both in one transaction)."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if connection.vendor == "postgresql" and outermost:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holds = {hold.pk: hold for hold in Hold.objects.filter(pk__in=list(hold_ids))}
        return holds, team_balance(team_id)
