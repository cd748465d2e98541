"""Whole-ledger invariant checks shared by the billing tests (read-only SQL over everything)."""

from __future__ import annotations

from django.db.models import F, Sum

from billing.models import (
    SOURCE_ACCOUNT_KINDS,
    Account,
    AccountKind,
    ChargeUsage,
    Entry,
    Hold,
    HoldStatus,
    Transfer,
    TransferKind,
)


def assert_ledger_consistent() -> None:
    # Every transfer's entries sum to zero, and every transfer has entries.
    unbalanced = Entry.objects.values("transfer_id").annotate(total=Sum("amount")).exclude(total=0)
    assert list(unbalanced) == []
    assert not Transfer.objects.filter(entries__isnull=True).exists()

    # Each account's balance is the sum of its entries, and the last balance_after.
    sums = dict(
        Entry.objects.values("account_id").annotate(t=Sum("amount")).values_list("account_id", "t")
    )
    for account in Account.objects.all():
        assert account.balance == sums.get(account.pk, 0), account
        last = Entry.objects.filter(account=account).order_by("-id").first()
        if last is not None:
            assert last.balance_after == account.balance, account
        if account.kind not in SOURCE_ACCOUNT_KINDS:
            assert account.balance >= 0, account

    # Holds: never over-resolved; closed holds fully resolved; the held account of each team
    # is exactly what its open holds still hold.
    assert not Hold.objects.filter(
        amount__lt=F("captured_gpu") + F("captured_storage") + F("released")
    ).exists()
    assert (
        not Hold.objects.exclude(status=HoldStatus.OPEN)
        .exclude(amount=F("captured_gpu") + F("captured_storage") + F("released"))
        .exists()
    )
    # Per hold, its usage charges add up to what it captured of each kind. A "gpu" charge is
    # all GPU time, a "storage" charge all storage, and a "gpu+storage" charge (the metering
    # sweep's) has both, its storage_amount being the storage part.
    captured: dict[int, list[int]] = {}
    for transfer in Transfer.objects.filter(kind=TransferKind.CAPTURE):
        assert transfer.hold_id is not None and transfer.usage_kind, transfer
        if transfer.usage_kind == ChargeUsage.GPU:
            assert transfer.storage_amount == 0, transfer
        elif transfer.usage_kind == ChargeUsage.STORAGE:
            assert transfer.storage_amount == transfer.amount, transfer
        else:
            assert transfer.usage_kind == ChargeUsage.GPU_AND_STORAGE, transfer
            assert 0 < transfer.storage_amount < transfer.amount, transfer
        parts = captured.setdefault(transfer.hold_id, [0, 0])
        parts[0] += transfer.amount - transfer.storage_amount
        parts[1] += transfer.storage_amount
        assert transfer.usage_split == (
            transfer.amount - transfer.storage_amount,
            transfer.storage_amount,
        )
    for hold in Hold.objects.all():
        assert [hold.captured_gpu, hold.captured_storage] == captured.get(hold.pk, [0, 0]), hold

    held_by_team: dict[int, int] = {}
    for hold in Hold.objects.filter(status=HoldStatus.OPEN):
        held_by_team[hold.team_id] = held_by_team.get(hold.team_id, 0) + hold.remaining
    for account in Account.objects.filter(kind=AccountKind.HELD):
        assert account.balance == held_by_team.get(account.team_id, 0), account

    # Conservation: credit that came in = balances + earnings + revenue + payouts.
    totals = dict(
        Account.objects.values("kind").annotate(t=Sum("balance")).values_list("kind", "t")
    )
    credit_in = -sum(totals.get(kind, 0) for kind in SOURCE_ACCOUNT_KINDS)
    held_somewhere = sum(
        totals.get(kind, 0)
        for kind in (
            AccountKind.AVAILABLE,
            AccountKind.HELD,
            AccountKind.EARNINGS,
            AccountKind.PLATFORM_REVENUE,
            AccountKind.PAYOUTS,
        )
    )
    assert credit_in == held_somewhere


def ledger_counts() -> tuple[int, int, int, list]:
    """A snapshot to prove that a failed operation wrote nothing."""
    return (
        Transfer.objects.count(),
        Entry.objects.count(),
        Hold.objects.count(),
        list(Account.objects.order_by("pk").values_list("pk", "balance")),
    )
