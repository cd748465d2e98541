"""The metering sweep's ledger side: settle the cumulative usage of many holds in bulk.

``holds_settle_usage`` applies the capture rule (``billing.capture.capture_due``) to thousands
of holds per transaction; the rental room computes what each rental owes and calls it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from billing.capture import capture_due
from billing.holds import capture_legs, platform_fee_percent
from billing.ledger import (
    AccountKey,
    Posting,
    balances_notify,
    lock_accounts,
    postings_write,
    require_amount,
)
from billing.models import AccountKind, ChargeUsage, Hold, TransferKind
from billing.pg_bulk import NewTransfer, SweptHoldRow, lock_open_holds
from billing.pg_settle import settle_batch_sql
from core.pg_bulk import bigint_array, bulk_set

# Holds settled per transaction. Bigger batches amortise each batch's fixed round trips (lock
# holds, lock accounts, COPY, two UPDATEs, commit), but a batch keeps its holds' and accounts'
# row locks until it commits, and a renter's rent or extend waits on its held account meanwhile.
SETTLE_BATCH_SIZE = 5000


class HoldUsage(NamedTuple):
    """What a rental owes so far on its hold (cumulative micro-dollars per usage kind)."""

    hold_id: int
    gpu: int
    storage: int


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk job such as the metering sweep.

    A sweep allocates hundreds of thousands of small objects that live until their batch
    commits, and each full collection rescans them along with everything else the worker
    holds. They form no reference cycles, so reference counting still frees them; the
    collector resumes afterwards.
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

    Per hold the rule of every capture (``capture.capture_due``: the difference between what
    is owed so far and what was captured, GPU time first, never more than the hold still
    holds, the platform fee differenced on the hold's cumulative captures) for both kinds at
    once, posted as **one** capture: ``usage_kind`` says which kinds it charges ("gpu",
    "storage" or "gpu+storage") and ``storage_amount`` how much of it is storage. Batches of ``SETTLE_BATCH_SIZE`` holds, each one transaction
    (holds locked in pk order, then accounts in pk order; every write in bulk). Closed or
    unknown holds are skipped. A repeated call, or a sweep that stopped half-way and runs
    again, captures nothing twice: captures are differences of cumulative totals. A hold
    listed twice counts with the larger total of each kind.
    """
    owed: dict[int, tuple[int, int]] = {}
    for hold_id, gpu, storage in usage:
        require_amount(gpu, field_name="gpu", allow_zero=True)
        require_amount(storage, field_name="storage", allow_zero=True)
        if hold_id in owed:
            gpu, storage = max(gpu, owed[hold_id][0]), max(storage, owed[hold_id][1])
        owed[hold_id] = (gpu, storage)
    hold_ids = sorted(owed)
    total = 0
    with cyclic_gc_paused():
        for start in range(0, len(hold_ids), SETTLE_BATCH_SIZE):
            batch = hold_ids[start : start + SETTLE_BATCH_SIZE]
            if connection.vendor == "postgresql":
                total += holds_settle_usage_sql(
                    "SELECT * FROM unnest(%(holds)s::bigint[], %(gpu)s::bigint[],"
                    " %(storage)s::bigint[]) AS u(hold_id, gpu, storage)",
                    {
                        "holds": bigint_array(batch),
                        "gpu": bigint_array(owed[pk][0] for pk in batch),
                        "storage": bigint_array(owed[pk][1] for pk in batch),
                    },
                )
            else:
                total += _settle_batch(batch, owed)
    return total


@transaction.atomic
def holds_settle_usage_sql(usage_sql: str, params: dict[str, Any]) -> int:
    """``holds_settle_usage`` for the holds a SQL query names, on PostgreSQL: one transaction,
    a few statements however many holds (``billing.pg_settle``); return the total captured.

    ``usage_sql`` selects ``hold_id, gpu, storage``: each hold at most once, with what it
    owes so far per kind (cumulative micro-dollars, never negative), ``%(name)s`` parameters
    from ``params``. The metering sweep computes what rentals owe that way, in the database,
    for a batch of ``SETTLE_BATCH_SIZE`` rentals at a time. Holds that owe nothing new are
    neither locked nor written.
    """
    total, team_ids = settle_batch_sql(
        usage_sql, params, percent=platform_fee_percent(), now=timezone.now()
    )
    balances_notify(team_ids)
    return total


class _SweptHold:
    """What the sweep reads and changes of a locked hold (no model instance per hold)."""

    __slots__ = ("pk", "captured_gpu", "captured_storage")

    def __init__(self, pk: int, captured_gpu: int, captured_storage: int) -> None:
        self.pk, self.captured_gpu, self.captured_storage = pk, captured_gpu, captured_storage


def _usage_and_key(
    pk: int, gpu_delta: int, storage_delta: int, gpu: int, storage: int
) -> tuple[ChargeUsage, str]:
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
    rows = lock_open_holds(hold_ids)
    percent = platform_fee_percent()
    # (hold row, GPU captured now, storage captured now, fee)
    plans: list[tuple[SweptHoldRow, int, int, int]] = []
    for row in rows:
        pk, _, _, _, _, amount, gpu, storage, released = row
        gpu_owed, storage_owed = owed[pk]
        # The rule every capture follows (pg_settle._PLAN is the same in SQL).
        due = capture_due(
            amount=amount,
            captured_gpu=gpu,
            captured_storage=storage,
            released=released,
            owed_gpu=gpu_owed,
            owed_storage=storage_owed,
            percent=percent,
        )
        if due.gpu or due.storage:
            plans.append((row, due.gpu, due.storage, due.fee))
    if not plans:
        return 0
    keys: set[AccountKey] = {(None, AccountKind.PLATFORM_REVENUE)}
    for row, *_ in plans:
        keys.add((row[1], AccountKind.HELD))
        keys.add((row[2], AccountKind.EARNINGS))
    accounts = lock_accounts(keys)
    revenue = accounts[(None, AccountKind.PLATFORM_REVENUE)]
    now = timezone.now()
    postings = []
    changed = []
    for row, gpu_delta, storage_delta, fee in plans:
        pk, team_id, provider_id, reference, machine, _, gpu, storage, _ = row
        gpu, storage = gpu + gpu_delta, storage + storage_delta
        delta = gpu_delta + storage_delta
        usage, key = _usage_and_key(pk, gpu_delta, storage_delta, gpu, storage)
        transfer = NewTransfer(
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
        legs = capture_legs(
            held=accounts[(team_id, AccountKind.HELD)],
            earnings=accounts[(provider_id, AccountKind.EARNINGS)],
            revenue=revenue,
            delta=delta,
            fee=fee,
        )
        postings.append(Posting(transfer, legs))
        changed.append(_SweptHold(pk, gpu, storage))
    bulk_set(Hold, ["captured_gpu", "captured_storage"], changed)
    postings_write(postings)
    balances_notify({row[1] for row, *_ in plans} | {row[2] for row, *_ in plans})
    return sum(gpu_delta + storage_delta for _, gpu_delta, storage_delta, _ in plans)
