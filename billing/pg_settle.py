"""The metering sweep's settlement as SQL on PostgreSQL: a batch of holds captured in a few
statements, no Python per hold.

Why: the sweep posts a capture per running rental every minute. Done in Python, each of
100,000 holds cost a tuple read, a plan, a transfer object, three entry rows and their COPY,
more Python CPU a sweep than the sweep's whole budget, on top of the database's work
(bench/metering.py; figures in docs/benchmarks.md). Here the
database computes what each hold captures from the cumulative usage a query gives it, and
writes the transfers, entries, holds and balances itself.

What each hold captures is ``billing.capture.capture_due``, the rule every capture follows
(``holds.hold_capture_usage``; ``billing.metering._settle_batch``, the sweep SQLite runs),
written here in SQL (statement 1) to the micro-dollar; ``tests/billing/test_metering.py``
holds the two together on generated rentals. Then as the Python sweep writes it:

* per kind the difference between the cumulative usage and what was captured, GPU time first,
  never more than the hold still holds; one capture per hold covering both kinds, keyed by its
  new cumulative totals (the same idempotency keys as the Python path);
* the platform fee differenced on the hold's cumulative captures, ``percent_of`` in numeric
  (exact, rounded half up), so its rounding never accumulates;
* a hold that owes nothing new is not locked and nothing is written for it;
* locks in the ledger's order: the batch's holds by primary key (statement 1), then their
  accounts by primary key (statement 3b). What needs only the holds' locks — the transfers
  and the holds' new totals (statement 2) — is written before the accounts are locked, so
  the accounts (which every batch shares: the platform's revenue account above all) stay
  locked only while the entries and balances are written (statement 4), and two batches
  on two connections overlap the rest;
* each capture's legs as ``holds.capture_legs``, zero legs dropped as ``postings_write`` does;
  each entry's ``balance_after`` is the account's balance plus the running sum of its legs in
  posting order (holds by primary key), and entries are inserted account by account in that
  order, so an account's entries read by id show its balance step by step, as the Python path
  writes them. Account by account rather than capture by capture: the window that computes
  ``balance_after`` already yields that order (no second sort), and each account's new index
  entries then go in together instead of one at a time all over the index; the sweep took
  less time so (docs/benchmarks.md, "Raised budgets").

The ledger's database guards still apply: the entry trigger checks every transfer of the
INSERT sums to zero and references existing transfers and accounts, CHECK constraints keep
balances and holds in range.
"""

from __future__ import annotations

from datetime import datetime
from fractions import Fraction
from typing import Any

import psycopg
from django.db import connection

from billing.models import AccountKind, ChargeUsage, HoldStatus, TransferKind

# The batch's plan: one row per hold that captures something (a temporary table, emptied at
# every commit and at the start of every batch).
_PLAN_TABLE = """
CREATE TEMP TABLE IF NOT EXISTS billing_sweep_plan (
    hold_id bigint NOT NULL, team_id bigint NOT NULL, provider_team_id bigint NOT NULL,
    reference text NOT NULL, machine_reference text NOT NULL,
    gpu_delta bigint NOT NULL, storage_delta bigint NOT NULL,
    gpu_total bigint NOT NULL, storage_total bigint NOT NULL, fee bigint NOT NULL,
    transfer_id bigint NOT NULL
) ON COMMIT DELETE ROWS
"""

# Statement 1: what each open hold captures now, planned from the usage query's cumulative
# totals (columns hold_id, gpu, storage) and the hold's row, locked in primary-key order: the
# rule of ``billing.capture.capture_due`` in SQL (g and s below; change both together). Only
# holds that capture something are locked and planned. The fee is ``percent_of`` of the
# cumulative captures after minus before: (2·amount·num + den) div (2·den), den = 100·denominator.
_PLAN = """
WITH usage AS MATERIALIZED ({usage})
INSERT INTO billing_sweep_plan
SELECT h.id, h.team_id, h.provider_team_id, h.reference, h.machine_reference,
       g.gpu_delta, s.storage_delta,
       h.captured_gpu + g.gpu_delta, h.captured_storage + s.storage_delta,
       div(2 * (h.captured_gpu + h.captured_storage + g.gpu_delta + s.storage_delta)::numeric
               * %(fee_num)s + %(fee_den)s, 2 * %(fee_den)s::numeric)
       - div(2 * (h.captured_gpu + h.captured_storage)::numeric * %(fee_num)s + %(fee_den)s,
             2 * %(fee_den)s::numeric),
       nextval(%(transfer_seq)s::regclass)
FROM usage u
JOIN billing_hold h ON h.id = u.hold_id
CROSS JOIN LATERAL (
    SELECT greatest(0, least(u.gpu - h.captured_gpu,
                             h.amount - h.captured_gpu - h.captured_storage - h.released))
           AS gpu_delta
) g
CROSS JOIN LATERAL (
    SELECT greatest(0, least(u.storage - h.captured_storage,
                             h.amount - h.captured_gpu - h.captured_storage - h.released
                             - g.gpu_delta))
           AS storage_delta
) s
WHERE h.status = %(open)s AND h.id = ANY(ARRAY(SELECT hold_id FROM usage))
  AND (g.gpu_delta > 0 OR s.storage_delta > 0)
ORDER BY h.id
FOR UPDATE OF h
"""

# Statement 3a: the accounts the captures post to, created where missing (the platform's
# revenue account on a fresh database; a concurrent creator is absorbed by ON CONFLICT).
_ENSURE_ACCOUNTS = """
INSERT INTO billing_account (team_id, kind, balance)
SELECT k.team_id, k.kind, 0
FROM (SELECT DISTINCT team_id, %(held)s AS kind FROM billing_sweep_plan
      UNION SELECT DISTINCT provider_team_id, %(earnings)s FROM billing_sweep_plan) AS k
WHERE NOT EXISTS (
    SELECT 1 FROM billing_account a WHERE a.kind = k.kind AND a.team_id = k.team_id
)
UNION ALL
SELECT NULL, %(revenue)s, 0
WHERE NOT EXISTS (
    SELECT 1 FROM billing_account a WHERE a.kind = %(revenue)s AND a.team_id IS NULL
)
ON CONFLICT DO NOTHING
"""

# The batch's accounts, as statements 3b and 4 read them.
_ACCOUNTS = """
SELECT id, team_id, kind, balance FROM billing_account
WHERE (kind = %(held)s AND team_id IN (SELECT team_id FROM billing_sweep_plan))
   OR (kind = %(earnings)s AND team_id IN (SELECT provider_team_id FROM billing_sweep_plan))
   OR (kind = %(revenue)s AND team_id IS NULL)
"""

# Statement 3b: lock them in primary-key order.
_LOCK_ACCOUNTS = f"SELECT count(*) FROM ({_ACCOUNTS} ORDER BY id FOR UPDATE) AS locked"  # noqa: S608

# Statement 2: the captures' transfers and the holds' new totals, before any account is
# locked (the holds are), so that a parallel batch's entries can be written meanwhile.
_WRITE_TRANSFERS = """
WITH transfers AS (
    INSERT INTO billing_transfer (id, kind, idempotency_key, team_id, reference, description,
                                  amount, fee, storage_amount, hold_id, usage_kind,
                                  machine_reference, created_by_id, created_at)
    SELECT transfer_id, %(capture)s,
           CASE WHEN storage_delta = 0 THEN 'capture:' || hold_id || ':gpu:' || gpu_total
                WHEN gpu_delta = 0 THEN 'capture:' || hold_id || ':storage:' || storage_total
                ELSE 'capture:' || hold_id || ':gpu:' || gpu_total || ':storage:' || storage_total
           END,
           team_id, reference, '', gpu_delta + storage_delta, fee, storage_delta, hold_id,
           CASE WHEN storage_delta = 0 THEN %(usage_gpu)s
                WHEN gpu_delta = 0 THEN %(usage_storage)s
                ELSE %(usage_both)s END,
           machine_reference, NULL, %(now)s
    FROM billing_sweep_plan ORDER BY transfer_id
)
UPDATE billing_hold SET captured_gpu = p.gpu_total, captured_storage = p.storage_total
FROM billing_sweep_plan p
-- The second id condition lets PostgreSQL fetch the holds through the primary key.
WHERE billing_hold.id = p.hold_id
  AND billing_hold.id = ANY(ARRAY(SELECT hold_id FROM billing_sweep_plan))
"""

# Statement 4 (after the accounts are locked): entries and balances.
_WRITE_ENTRIES = f"""
WITH p AS MATERIALIZED (
    SELECT plan.*, plan.gpu_delta + plan.storage_delta AS delta FROM billing_sweep_plan plan
),
acc AS MATERIALIZED ({_ACCOUNTS}),
held AS MATERIALIZED (
    SELECT id, team_id FROM billing_account
    WHERE kind = %(held)s AND team_id IN (SELECT team_id FROM billing_sweep_plan)
),
earned AS MATERIALIZED (
    SELECT id, team_id FROM billing_account
    WHERE kind = %(earnings)s AND team_id IN (SELECT provider_team_id FROM billing_sweep_plan)
),
legs AS MATERIALIZED (
    SELECT p.transfer_id, l.leg, l.account_id, l.amount
    FROM p
    JOIN held ON held.team_id = p.team_id
    JOIN earned ON earned.team_id = p.provider_team_id
    CROSS JOIN LATERAL (VALUES
        (1, held.id, -p.delta),
        -- capture_legs: when the fee is the whole charge, the gross goes to the provider's
        -- earnings and the fee comes back out of it (the provider's ledger shows the charge).
        (2, earned.id, CASE WHEN p.fee = p.delta THEN p.delta ELSE p.delta - p.fee END),
        (3, earned.id, CASE WHEN p.fee = p.delta THEN -p.fee ELSE 0 END),
        (4, (SELECT id FROM billing_account WHERE kind = %(revenue)s AND team_id IS NULL),
         p.fee)
    ) AS l(leg, account_id, amount)
    WHERE l.amount <> 0
),
entries AS (
    INSERT INTO billing_entry (transfer_id, account_id, team_id, account_kind, amount,
                               balance_after, created_at)
    SELECT l.transfer_id, l.account_id, a.team_id, a.kind, l.amount,
           a.balance + sum(l.amount) OVER (PARTITION BY l.account_id
                                           ORDER BY l.transfer_id, l.leg),
           %(now)s
    FROM legs l JOIN acc a ON a.id = l.account_id
    ORDER BY l.account_id, l.transfer_id, l.leg
),
balances AS (
    UPDATE billing_account SET balance = billing_account.balance + s.total
    FROM (SELECT account_id, sum(amount) AS total FROM legs GROUP BY account_id) AS s
    WHERE billing_account.id = s.account_id
)
SELECT coalesce(sum(delta), 0)::bigint,
       (SELECT array_agg(DISTINCT t) FROM (SELECT team_id FROM p
                                           UNION SELECT provider_team_id FROM p) AS teams(t))
FROM p
"""  # noqa: S608  (the text is this module's constants; every value is a parameter)

_transfer_sequence: str | None = None


def _names() -> dict[str, str]:
    return {
        "held": AccountKind.HELD.value,
        "earnings": AccountKind.EARNINGS.value,
        "revenue": AccountKind.PLATFORM_REVENUE.value,
    }


def settle_batch_sql(
    usage_sql: str, usage_params: dict[str, Any], *, percent: Fraction, now: datetime
) -> tuple[int, list[int]]:
    """Capture, for every open hold the usage query names, what it owes beyond what was
    captured; return (total captured, the teams whose balances changed).

    ``usage_sql`` selects ``hold_id, gpu, storage`` (cumulative micro-dollars, each hold at
    most once) with ``%(name)s`` parameters from ``usage_params``. The caller holds the
    transaction; this runs the statements of the module's docstring in it.
    """
    global _transfer_sequence
    connection.ensure_connection()
    names = _names()
    with psycopg.Cursor(connection.connection) as cursor:
        if _transfer_sequence is None:
            cursor.execute("SELECT pg_get_serial_sequence('billing_transfer', 'id')")
            sequence = cursor.fetchone()
            assert sequence is not None  # a SELECT without FROM returns one row
            _transfer_sequence = sequence[0]
        # The planner's cost estimates for these statements pass the JIT thresholds, and
        # compiling them cost more than running them, every batch; they are simple row
        # arithmetic, which the interpreter does fast enough. For this transaction only.
        cursor.execute("SET LOCAL jit = off")
        # This transaction's commit need not wait for its WAL to reach the disk: the sweep is
        # idempotent. What it writes is computed from the rentals' clocks and each hold's
        # cumulative captures, and the transfers, entries, balances and the holds' new totals
        # commit together; if a crash loses the commit, all of it is lost together and the
        # next sweep captures the same usage again as the difference of cumulative totals
        # (nothing lost, nothing twice). PostgreSQL replays WAL in order, so a later commit
        # that waits (a rent, a settlement) makes this one durable first. The risk is only a
        # balance pushed to a console that a crash then rolls back until the next sweep.
        cursor.execute("SET LOCAL synchronous_commit = off")
        cursor.execute(_PLAN_TABLE)
        # ON COMMIT empties it, but a caller's outer transaction (a test's) may not commit.
        cursor.execute("DELETE FROM billing_sweep_plan")
        cursor.execute(
            _PLAN.format(usage=usage_sql),
            {
                **usage_params,
                "fee_num": percent.numerator,
                "fee_den": percent.denominator * 100,
                "open": HoldStatus.OPEN.value,
                "transfer_seq": _transfer_sequence,
            },
        )
        if not cursor.rowcount:
            return 0, []
        cursor.execute(
            _WRITE_TRANSFERS,
            {
                "capture": TransferKind.CAPTURE.value,
                "usage_gpu": ChargeUsage.GPU.value,
                "usage_storage": ChargeUsage.STORAGE.value,
                "usage_both": ChargeUsage.GPU_AND_STORAGE.value,
                "now": now,
            },
        )
        cursor.execute(_ENSURE_ACCOUNTS, names)
        cursor.execute(_LOCK_ACCOUNTS, names)
        cursor.execute(_WRITE_ENTRIES, {**names, "now": now})
        summary = cursor.fetchone()
        assert summary is not None  # its final SELECT aggregates, so returns one row
        total, team_ids = summary
    return total, list(team_ids or [])
