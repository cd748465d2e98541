"""Metering: what a rental owes from its clocks, captured as the difference from what was
already captured, so a repeated run captures nothing and rounding never accumulates.

``metering_sweep`` runs over every open rental. On PostgreSQL the database computes what each
owes (``_OWED_SQL``: ``rental_owed``'s arithmetic, exact) and settles it (``billing.pg_settle``),
with no Python per rental; on SQLite it reads open rentals as plain tuples (not model
instances) and computes with ``rental_owed``. ``tests/billing/test_metering.py`` holds both to
the same integers.
"""

from __future__ import annotations

import queue
import threading
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

import psycopg
from django.conf import settings
from django.db import connection
from django.utils import timezone
from psycopg.types.datetime import TimestamptzLoader

from billing import holds
from billing import metering as billing_metering
from billing.money import SECONDS_PER_HOUR, usage_owed
from marketplace.models import Rental
from marketplace.services.pricing import SECONDS_PER_MONTH, Quote, storage_owed

if TYPE_CHECKING:
    from billing.models import Hold


def rental_owed(rental: Rental, now: datetime) -> Quote:
    """What the rental owes for GPU time and storage up to ``now`` (cumulative), each
    rounded once from its clock's seconds: what ``billing.capture.capture_due`` captures from.
    ``_OWED_SQL`` below is the same arithmetic in SQL (the sweep on PostgreSQL); change both
    together."""
    return Quote(
        # price × GPU-seconds: the same integer as (price × count) × seconds, rounded once,
        # and GPU-seconds banked at earlier counts add to it; so does what was owed at
        # earlier prices (a bid that changed).
        gpu=rental.gpu_owed_banked
        + usage_owed(
            rate_per_hour=rental.price_per_gpu_hour,
            seconds=rental.gpu_unit_seconds + rental.gpu_count * rental.gpu_seconds_at(now),
        ),
        storage=rental.storage_owed_banked
        + storage_owed(
            price_per_gb_month=rental.storage_price_per_gb_month,
            disk_gb=rental.disk_gb,
            seconds=rental.storage_seconds_at(now),
        ),
    )


def rental_bank_gpu_owed(rental: Rental, now: datetime) -> None:
    """Bank what the GPU time owes at the current price and count and restart its reading
    from ``now``, before either changes (a new bid). The caller holds the rental's lock and
    saves ``BANK_GPU_FIELDS``."""
    rental.gpu_owed_banked = rental_owed(rental, now).gpu
    rental.gpu_unit_seconds = 0
    rental.gpu_seconds = 0
    if rental.gpu_clock_since is not None:
        rental.gpu_clock_since = rental.billable_until(now)


def rental_bank_storage_owed(rental: Rental, now: datetime) -> None:
    """Bank what storage owes at the current price and size and restart its reading from
    ``now``, before either changes (a version with another disk size). The caller holds the
    rental's lock and saves ``BANK_STORAGE_FIELDS``."""
    rental.storage_owed_banked = rental_owed(rental, now).storage
    rental.storage_seconds = 0
    if rental.storage_clock_since is not None:
        rental.storage_clock_since = rental.billable_until(now)


BANK_GPU_FIELDS = ["gpu_owed_banked", "gpu_unit_seconds", "gpu_seconds", "gpu_clock_since"]
BANK_STORAGE_FIELDS = ["storage_owed_banked", "storage_seconds", "storage_clock_since"]


def rental_meter(*, rental: Rental, now: datetime | None = None, hold: Hold | None = None) -> int:
    """Capture what is owed so far beyond what was captured (0 on a repeated run).

    ``hold``, the rental's hold as locked earlier in this transaction, lets a rental that owes
    nothing new (a state change a moment after the last capture) skip the captures, which
    would each lock and read the hold again to find the same.
    """
    if rental.settled_at is not None:
        return 0
    owed = rental_owed(rental, now or timezone.now())
    if (
        hold is not None
        and 0 <= owed.gpu <= hold.captured_gpu
        and (0 <= owed.storage <= hold.captured_storage)
    ):
        return 0
    captured = holds.hold_capture_usage(hold_id=rental.hold_id, kind="gpu", owed_total=owed.gpu)
    captured += holds.hold_capture_usage(
        hold_id=rental.hold_id, kind="storage", owed_total=owed.storage
    )
    return captured


class _MeteredRental(NamedTuple):
    """The columns of an open rental that metering reads. It borrows Rental's own clock
    methods, so the sweep reads the clocks exactly as ``rental_meter`` does, without building
    a model instance per rental."""

    pk: int
    hold_id: int
    gpu_count: int
    price_per_gpu_hour: int
    storage_price_per_gb_month: int
    disk_gb: int
    ends_at: datetime
    gpu_seconds: int
    gpu_unit_seconds: int
    gpu_owed_banked: int
    storage_owed_banked: int
    gpu_clock_since: datetime | None
    storage_seconds: int
    storage_clock_since: datetime | None

    billable_until = Rental.billable_until
    gpu_seconds_at = Rental.gpu_seconds_at
    storage_seconds_at = Rental.storage_seconds_at
    _running_seconds = Rental._running_seconds


def _open_rentals_after(last_pk: int, limit: int) -> list[_MeteredRental]:
    """The next ``limit`` open rentals after ``last_pk``, in primary-key order.

    On PostgreSQL the rows are read with psycopg's own timestamp loader (in C) rather than
    Django's (in Python); elsewhere through the ORM. Both give the same tuples.
    """
    query = (
        Rental.objects.filter(settled_at=None, pk__gt=last_pk)
        .order_by("pk")
        .values_list(*_MeteredRental._fields)[:limit]
    )
    if connection.vendor != "postgresql":
        return [_MeteredRental(*row) for row in query]
    sql, params = query.query.sql_with_params()
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        cursor.execute(sql, params)
        return [_MeteredRental(*row) for row in cursor]


def metering_sweep(*, batch_size: int = 5000, now: datetime | None = None) -> int:
    """Capture every open rental's usage up to ``now``, in batches; return what was captured.

    Each batch of rentals (primary-key order) becomes one settlement transaction: one capture
    per hold that owes something new, for both kinds. The rentals are read without a lock: the
    capture is a difference of cumulative totals taken under the hold's lock, so a rental that
    changed meanwhile is simply caught up by the next sweep. Run again at the same ``now``, it
    captures nothing.

    On PostgreSQL the database computes what each rental owes (``_OWED_SQL``, the arithmetic
    of ``rental_owed``) and settles it (``holds_settle_usage_sql``): no Python per rental.
    Elsewhere (SQLite) each batch is read into Python and handed to ``holds_settle_usage``.
    """
    now = now or timezone.now()
    if connection.vendor == "postgresql":
        return _metering_sweep_sql(batch_size, now)
    total = 0
    last_pk = 0
    with billing_metering.cyclic_gc_paused():
        while batch := _open_rentals_after(last_pk, batch_size):
            usage = []
            for rental in batch:
                owed = rental_owed(rental, now)
                usage.append(billing_metering.HoldUsage(rental.hold_id, owed.gpu, owed.storage))
            total += billing_metering.holds_settle_usage(usage)
            last_pk = batch[-1].pk
    return total


def _clock_seconds_sql(since: str) -> str:
    """``Rental._running_seconds`` in SQL: whole seconds (truncated) from ``since`` to the
    reading time (``now``, never past ``ends_at``), 0 for a stopped clock or a negative span.
    ``extract(epoch …)`` of a timestamp is an exact numeric (microseconds), as Python's
    ``total_seconds()`` is for the spans involved."""
    return (
        f"CASE WHEN {since} IS NULL THEN 0 ELSE greatest(trunc("
        f"extract(epoch FROM least(%(now)s::timestamptz, ends_at)) - extract(epoch FROM {since})"
        "), 0) END"
    )


# What each open rental of a batch owes so far, per kind: ``rental_owed`` in numeric (exact),
# each charge rounded once, half up: (rate × seconds + half a period) div the period.
_OWED_SQL = f"""
SELECT hold_id,
       (gpu_owed_banked + div(price_per_gpu_hour::numeric
            * (gpu_unit_seconds + gpu_count * (gpu_seconds + {_clock_seconds_sql("gpu_clock_since")}))
            + {SECONDS_PER_HOUR // 2}, {SECONDS_PER_HOUR}))::bigint AS gpu,
       (storage_owed_banked + div(storage_price_per_gb_month::numeric * disk_gb
            * (storage_seconds + {_clock_seconds_sql("storage_clock_since")})
            + {SECONDS_PER_MONTH // 2}, {SECONDS_PER_MONTH}))::bigint AS storage
FROM marketplace_rental
WHERE settled_at IS NULL AND id > %(after)s AND (%(upto)s::bigint IS NULL OR id <= %(upto)s)
"""  # noqa: S608  (no input in the text: constants and parameters only)


# How many connections a sweep settles its batches on (PostgreSQL, outside a transaction) is
# ``settings.METERING_SWEEP_CONNECTIONS``: a batch keeps the shared accounts locked only while
# it writes its entries, so a second connection can plan and write its next batch's transfers
# meanwhile. Two by default: on a quiet 2-core machine (bench/metering.py, 100,000 rentals)
# two swept clearly faster than one; three were no faster than two, and under heavy load the
# noise hides the difference (figures in docs/benchmarks.md, "Raised budgets").


def _batch_bounds(batch_size: int) -> list[tuple[int, int | None]]:
    """The sweep's batches as (after id, up to id) ranges of ``batch_size`` open rentals each
    (the last one open-ended, so rentals made meanwhile are swept too)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM (SELECT id, row_number() OVER (ORDER BY id) AS n"
            " FROM marketplace_rental WHERE settled_at IS NULL) AS open_rentals"
            " WHERE n %% %s = 0 ORDER BY id",
            [batch_size],
        )
        ends = [row[0] for row in cursor.fetchall()]
    starts = [0, *ends]
    return list(zip(starts, [*ends, None], strict=True))


def _metering_sweep_sql(batch_size: int, now: datetime) -> int:
    batches = _batch_bounds(batch_size)

    def settle(after: int, upto: int | None) -> int:
        return billing_metering.holds_settle_usage_sql(
            _OWED_SQL, {"now": now, "after": after, "upto": upto}
        )

    connections = settings.METERING_SWEEP_CONNECTIONS
    if connection.in_atomic_block or connections < 2 or len(batches) < 2:
        # Inside a caller's transaction (a test's) another connection would not see its rows,
        # and the sweep belongs to that transaction: one connection.
        return sum(settle(after, upto) for after, upto in batches)
    pending = queue.SimpleQueue()
    for bounds in batches:
        pending.put(bounds)
    totals: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            while not errors:
                try:
                    after, upto = pending.get_nowait()
                except queue.Empty:
                    return
                totals.append(settle(after, upto))
        except BaseException as error:  # noqa: BLE001 - raised again in the sweep's thread
            errors.append(error)
        finally:
            connection.close()  # this thread's own connection

    threads = [threading.Thread(target=work) for _ in range(min(connections, len(batches)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return sum(totals)
