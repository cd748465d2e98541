"""Bulk writes on PostgreSQL, each beside the ORM's portable path for the other databases.

Why it exists: where many rows are written at once (the metering sweep's thousands of captures,
a batch of rents, a deployment's placed replicas) the generic ORM statements (an IN list of a
parameter per id, ``bulk_create`` building SQL text, a CASE per row in ``bulk_update``) cost
more than the work itself. So on PostgreSQL ids go as one ``bigint[]`` parameter, new rows take
their ids from ``nextval`` and load with binary COPY (a single row: one INSERT), and columns
are updated from ``unnest``. ``make run``'s embedded database is SQLite, which has none of
these; there each function takes the ORM's portable path. Both paths write the same rows; the
SQLite job of ``scripts/test.sh`` runs the money tests on the twins.

Identifiers in the SQL here come from the model's metadata or the caller's constants, never
from input; every value is a parameter or streamed through COPY.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar, cast

import psycopg
from django.db import connection, models, transaction
from django.db.models.expressions import RawSQL
from psycopg.types.json import Jsonb

_M = TypeVar("_M", bound=models.Model)


class Keyed(Protocol):
    """What ``bulk_set`` writes from: a model instance, or anything with a ``pk``."""

    @property
    def pk(self) -> int | None: ...


def bigint_array(values: Iterable[int | None]) -> str:
    """A bigint[] parameter in PostgreSQL's array text, ``{1,2,3}`` (cast with ::bigint[]).
    psycopg would dump a list item by item in Python."""
    return "{" + ",".join("NULL" if value is None else str(value) for value in values) + "}"


def ids_in(ids: set[int]) -> RawSQL | set[int]:
    """The right-hand side of an ``…__in`` lookup on big integer ids: on PostgreSQL one array
    parameter (the sweep locks thousands of accounts, and a parameter each costs more than the
    query); elsewhere the set itself."""
    if connection.vendor == "postgresql":
        return RawSQL("SELECT unnest(%s::bigint[])", [bigint_array(sorted(ids))])
    return ids


# Column types binary COPY sends each kind of model field as (``insert_models``).
COPY_TYPES = {
    "BigAutoField": "int8", "BigIntegerField": "int8", "IntegerField": "int4",
    "PositiveIntegerField": "int4", "SmallIntegerField": "int2",
    "PositiveSmallIntegerField": "int2", "CharField": "text", "TextField": "text",
    "BooleanField": "bool", "DateTimeField": "timestamptz", "UUIDField": "uuid",
    "FloatField": "float8", "JSONField": "jsonb",
}  # fmt: skip


# Fewer rows than this are upserted in one INSERT … VALUES … ON CONFLICT, their values inline
# as psycopg writes parameters (``upsert_models``): making, filling and dropping a temporary
# table costs several statements, and the ORM's bulk_create prepared each value through its
# field, several times the statement (a rent refreshes its machine's handful of offers).
FEW_ROWS = 8


def insert_models(model: type[_M], objects: list[_M]) -> None:
    """INSERT new model instances, giving each its ``pk``: on PostgreSQL, ids from the
    sequence and one binary COPY (the ORM's bulk_create spends most of its time preparing
    each value), or for one row, one INSERT … VALUES … RETURNING; elsewhere, or for a model
    with a field COPY is not taught here, ``bulk_create``. No signals are sent, as with
    ``bulk_create``."""
    if not objects:
        return
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    types = [t for t in (_copy_type(f) for f in fields) if t is not None]
    if connection.vendor != "postgresql" or len(types) < len(fields):
        model._base_manager.bulk_create(objects)
        return
    for obj in objects:
        for f in fields:
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                f.pre_save(obj, add=True)
    table = model._meta.db_table
    json_at = [n for n, t in enumerate(types) if t == "jsonb"]
    names = [f.attname for f in fields]
    if len(objects) == 1:
        # One statement where a COPY takes three round trips (the ids, its start, its end).
        # Two rows or more by COPY: written inline, their values cost psycopg more than the
        # round trips saved (past 50 parameters it parses the statement anew each time).
        quote = connection.ops.quote_name
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {quote(table)} ({', '.join(quote(f.column) for f in fields)})"  # noqa: S608
                f" VALUES ({', '.join(['%s'] * len(fields))}) RETURNING id",
                _copy_values(objects[0], names, json_at),
            )
            ids = [row[0] for row in cursor.fetchall()]
        _stored(objects, ids)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [table, len(objects)],
        )
        ids = [row[0] for row in cursor.fetchall()]
    _stored(objects, ids)

    def row(obj: _M) -> tuple[Any, ...]:
        return (obj.pk, *_copy_values(obj, names, json_at))

    columns = [("id", "int8"), *((f.column, t) for f, t in zip(fields, types, strict=True))]
    copy_rows(table, columns, (row(obj) for obj in objects))


def _stored(objects: list[_M], ids: list[int]) -> None:
    """The instances are rows now: each has its id, and saving one again updates it."""
    for pk, obj in zip(ids, objects, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = "default"


def _copy_values(obj: models.Model, names: list[str], json_at: list[int]) -> list[Any]:
    """An instance's values of ``names`` as COPY takes them (JSON columns wrapped)."""
    values = [getattr(obj, name) for name in names]
    for n in json_at:
        if values[n] is not None:
            values[n] = Jsonb(values[n])
    return values


def upsert_models(
    model: type[_M], objects: list[_M], *, unique_fields: list[str], update_fields: list[str]
) -> list[_M]:
    """INSERT model instances, or UPDATE ``update_fields`` of the row already there with the
    same ``unique_fields``, giving each instance its row's ``pk``: ``bulk_create`` with
    ``update_conflicts``, which on PostgreSQL spends most of its time preparing each value
    (a batch of placements refreshes thousands of offers of ~50 columns). On PostgreSQL the
    rows go by binary COPY into a temporary table, then one INSERT … SELECT … ON CONFLICT (a
    few rows: one INSERT … VALUES … ON CONFLICT); elsewhere, or for a model with a field COPY
    is not taught here, ``bulk_create``."""
    if not objects:
        return objects
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    types = [t for t in (_copy_type(f) for f in fields) if t is not None]
    if connection.vendor != "postgresql" or len(types) < len(fields):
        return model._base_manager.bulk_create(
            objects, update_conflicts=True, unique_fields=unique_fields, update_fields=update_fields
        )
    for obj in objects:
        for f in fields:
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                f.pre_save(obj, add=True)
    quote = connection.ops.quote_name
    table = model._meta.db_table
    staged = f"upsert_{table}"
    by_name = {**{f.attname: f for f in fields}, **{f.name: f for f in fields}}
    columns = [quote(f.column) for f in fields]
    unique = [quote(by_name[name].column) for name in unique_fields]
    sets = ", ".join(
        f"{quote(by_name[name].column)} = EXCLUDED.{quote(by_name[name].column)}"
        for name in update_fields
    )
    json_at = [n for n, t in enumerate(types) if t == "jsonb"]
    names = [f.attname for f in fields]

    def row(obj: _M) -> tuple[Any, ...]:
        return tuple(_copy_values(obj, names, json_at))

    conflict = (
        f" ON CONFLICT ({', '.join(unique)}) DO UPDATE SET {sets} RETURNING id, {', '.join(unique)}"
    )
    if len(objects) < FEW_ROWS:
        # One statement, no temporary table (``FEW_ROWS``): a rent refreshes its machine's
        # handful of offers.
        one = "(" + ", ".join(["%s"] * len(columns)) + ")"
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {quote(table)} ({', '.join(columns)})"  # noqa: S608
                f" VALUES {', '.join([one] * len(objects))}{conflict}",
                [value for obj in objects for value in row(obj)],
            )
            ids = {tuple(key): pk for pk, *key in cursor.fetchall()}
        return _with_ids(objects, ids, [by_name[name].attname for name in unique_fields])
    # The staging table is the connection's, made at its first upsert of the model and kept:
    # making and dropping it each time wrote and deleted a catalog row per column (~50 for an
    # offer), 1.9 ms of PostgreSQL for a batch of four rents against 1.0 ms kept (2026-12-07).
    # ``ON COMMIT DELETE ROWS`` cuts its file to nothing at each commit, so no dead rows pile
    # up in a table autovacuum never visits; hence a transaction around the upsert (the
    # caller's, without a savepoint). Emptied first: two upserts in one transaction never see
    # each other's rows.
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {staged} ON COMMIT DELETE ROWS AS"  # noqa: S608
            f" SELECT {', '.join(columns)} FROM {quote(table)} WITH NO DATA; DELETE FROM {staged}"
        )
        copy_rows(staged, list(zip(columns, types, strict=True)), (row(obj) for obj in objects))
        cursor.execute(
            f"INSERT INTO {quote(table)} ({', '.join(columns)})"  # noqa: S608
            f" SELECT {', '.join(columns)} FROM {staged}{conflict}"
        )
        ids = {tuple(key): pk for pk, *key in cursor.fetchall()}
    return _with_ids(objects, ids, [by_name[name].attname for name in unique_fields])


def _with_ids(
    objects: list[_M], ids: dict[tuple[Any, ...], int], unique_attnames: list[str]
) -> list[_M]:
    """The upserted instances, each given its row's ``pk`` (``ids`` by their unique values)."""
    _stored(
        objects, [ids[tuple(getattr(obj, name) for name in unique_attnames)] for obj in objects]
    )
    return objects


def _copy_type(field: models.Field[Any, Any]) -> str | None:
    kind = field.get_internal_type()
    if kind in ("ForeignKey", "OneToOneField"):
        kind = _target_field(field).get_internal_type()
    if kind == "JSONField" and cast("models.JSONField[Any]", field).encoder is not None:
        return None  # its own encoder: the ORM knows how to write it
    if kind in ("BigAutoField", "AutoField") and not field.primary_key:
        kind = "BigIntegerField"
    return COPY_TYPES.get(kind)


def copy_rows(table: str, columns: list[tuple[str, str]], rows: Iterable[tuple[Any, ...]]) -> None:
    """Binary COPY of rows into a table: no value is formatted as text and parsed back, which
    the ORM's bulk_create spends most of its time on. ``columns`` name each column's type.
    A database error is raised as Django's (a unique violation as ``IntegrityError``), as the
    ORM's own statements raise it."""
    names = ", ".join(name for name, _ in columns)
    connection.ensure_connection()
    with (
        connection.wrap_database_errors,
        connection.connection.cursor() as cursor,
        cursor.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types([cast for _, cast in columns])
        for row in rows:
            copy.write_row(row)


def bulk_set(model: type[models.Model], fields: list[str], objects: Sequence[Keyed]) -> None:
    """UPDATE many rows' columns in one statement: ``unnest`` of arrays on PostgreSQL when
    every column is a big integer (a foreign key to one too) or text; ``bulk_update``
    otherwise; a plain UPDATE for one row. ``objects`` are model instances or anything with
    ``pk`` and the fields (a foreign key by its ``…_id`` name)."""
    if not objects:
        return
    # ``fields`` name columns of the model (get_field could also find relations and generic
    # foreign keys, which have none).
    model_fields = [cast("models.Field[Any, Any]", model._meta.get_field(name)) for name in fields]
    names = [f.attname for f in model_fields]
    if len(objects) == 1:
        obj = objects[0]
        model._base_manager.filter(pk=obj.pk).update(**{n: getattr(obj, n) for n in names})
        return
    types = [_array_type(f) for f in model_fields]
    if connection.vendor != "postgresql" or None in types:
        instances = [
            obj
            if isinstance(obj, model)
            else model(pk=obj.pk, **{n: getattr(obj, n) for n in names})
            for obj in objects
        ]
        model._base_manager.bulk_update(instances, fields, batch_size=500)
        return
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    columns = [quote(f.column) for f in model_fields]
    sets = ", ".join(f"{column} = v.{column}" for column in columns)
    arrays = ", ".join(["%s::bigint[]", *(f"%s::{t}" for t in types)])
    aliases = ", ".join([quote("id"), *columns])
    # The second id condition lets PostgreSQL fetch the rows through the primary key; with the
    # join alone it hashes a scan of the whole table, every batch.
    sql = (
        f"UPDATE {table} SET {sets} FROM unnest({arrays}) AS v({aliases})"  # noqa: S608
        f" WHERE {table}.id = v.id AND {table}.id = ANY(%s::bigint[])"
    )
    ids = bigint_array(obj.pk for obj in objects)
    columns_values = [
        bigint_array(getattr(obj, name) for obj in objects)
        if array_type == "bigint[]"
        else [getattr(obj, name) for obj in objects]
        for name, array_type in zip(names, types, strict=True)
    ]
    params = [ids, *columns_values, ids]
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params)


def _array_type(field: models.Field[Any, Any]) -> str | None:
    """The PostgreSQL array type ``bulk_set`` sends a column's values as, if it can."""
    kind = field.get_internal_type()
    if kind in ("ForeignKey", "OneToOneField"):
        kind = _target_field(field).get_internal_type()
    if kind in ("BigIntegerField", "BigAutoField"):
        return "bigint[]"
    if kind in ("CharField", "TextField"):
        return "text[]"
    return None


def _target_field(field: models.Field[Any, Any]) -> models.Field[Any, Any]:
    """The field a foreign key points at (callers checked its internal type: a ForeignKey or
    OneToOneField)."""
    return cast("models.ForeignKey[Any, Any]", field).target_field
