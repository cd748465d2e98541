"""The ledger's bulk writes and locks: a PostgreSQL path and, beside it, its SQLite twin.

Why they are the ledger's: they write transfers and their entries and lock holds, rows only
billing owns. The generic machinery they stand on (binary COPY, ``unnest`` updates, array
parameters) is ``core.pg_bulk``'s, with the reason for each path. Both paths write the same
rows under the same locks; the SQLite job of ``scripts/test.sh`` runs the money tests on the
twins.

Identifiers in the SQL here come from constants of this module, never from input; every value is a parameter or streamed through COPY.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import cast

import psycopg
from django.db import connection
from django.utils import timezone

from billing.models import Account, Entry, Hold, HoldStatus, Transfer
from core.pg_bulk import bigint_array, copy_rows

# A transfer's columns with their PostgreSQL types (binary COPY needs each column's exact type).
TRANSFER_COLUMNS = [
    ("kind", "text"), ("idempotency_key", "text"), ("team_id", "int8"), ("reference", "text"),
    ("description", "text"), ("amount", "int8"), ("fee", "int8"), ("storage_amount", "int8"),
    ("hold_id", "int8"),
    ("usage_kind", "text"), ("machine_reference", "text"), ("created_by_id", "int8"),
    ("created_at", "timestamptz"),
]  # fmt: skip
ENTRY_COLUMNS = [
    ("transfer_id", "int8"), ("account_id", "int8"), ("team_id", "int8"),
    ("account_kind", "text"), ("amount", "int8"), ("balance_after", "int8"),
    ("created_at", "timestamptz"),
]  # fmt: skip
# The columns of a hold that the metering sweep reads, in this order.
SWEPT_HOLD_COLUMNS = (
    "id", "team_id", "provider_team_id", "reference", "machine_reference", "amount",
    "captured_gpu", "captured_storage", "released",
)  # fmt: skip
# One row of them: id, team, provider team, reference, machine reference, amount, captured
# GPU, captured storage, released.
SweptHoldRow = tuple[int, int, int, str, str, int, int, int, int]

# (account, amount, balance after, transfer) of one entry.
EntryRow = tuple[Account, int, int, "Transfer | NewTransfer"]


@dataclass(slots=True)
class NewTransfer:
    """The columns of a Transfer about to be written in bulk, without a model instance per
    row (building thousands of them costs more than writing them). Writing gives it its
    ``pk``."""

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
        return Transfer(**{name: getattr(self, name) for name, _ in TRANSFER_COLUMNS})


def insert_transfers_and_entries(
    transfers: list[Transfer | NewTransfer], entry_rows: list[EntryRow]
) -> None:
    """Insert the transfers and their entries, giving each transfer its ``pk``.

    PostgreSQL, more than one transfer: ids from the sequence first, so both tables load
    with COPY; every entry goes in one COPY statement, and the database checks that each
    transfer sums to zero. Otherwise: ``bulk_create`` of both.
    """
    if connection.vendor == "postgresql" and len(transfers) > 1:
        _insert_transfers_and_entries_pg(transfers, entry_rows)
        return
    models = [t if isinstance(t, Transfer) else t.as_model() for t in transfers]
    Transfer.objects.bulk_create(models)
    for transfer, model in zip(transfers, models, strict=True):
        transfer.pk = model.pk
    Entry.objects.bulk_create(
        [
            Entry(
                transfer_id=cast(int, transfer.pk),  # bulk_create gave it one just above
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


def _insert_transfers_and_entries_pg(
    transfers: list[Transfer | NewTransfer], entry_rows: list[EntryRow]
) -> None:
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
    columns = attrgetter(*(name for name, _ in TRANSFER_COLUMNS))
    copy_rows(
        "billing_transfer",
        [("id", "int8"), *TRANSFER_COLUMNS],
        ((t.pk, *columns(t)) for t in transfers),
    )
    copy_rows(
        "billing_entry",
        ENTRY_COLUMNS,
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


def lock_open_holds(hold_ids: list[int]) -> list[SweptHoldRow]:
    """Lock the open holds among ``hold_ids`` in primary-key order; rows of
    ``SWEPT_HOLD_COLUMNS``. On PostgreSQL the ids go as one array parameter (an IN list of
    thousands of parameters costs more to build than the query costs to run)."""
    if connection.vendor != "postgresql":
        return list(
            Hold.objects.select_for_update()
            .filter(pk__in=hold_ids, status=HoldStatus.OPEN)
            .order_by("pk")
            .values_list(*SWEPT_HOLD_COLUMNS)
        )
    sql = (
        f"SELECT {', '.join(SWEPT_HOLD_COLUMNS)} FROM billing_hold"  # noqa: S608
        " WHERE id = ANY(%s::bigint[]) AND status = %s ORDER BY id FOR UPDATE"
    )
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, [bigint_array(hold_ids), HoldStatus.OPEN.value])
        return cursor.fetchall()
