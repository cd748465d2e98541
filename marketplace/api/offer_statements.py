"""Offer search statements, compiled once per shape of search.

Composing and compiling a search with the ORM cost about as much CPU as PostgreSQL spends
answering most searches at a million offers (bench/offer_search.py). The statement depends on
the search's shape — which fields it filters with which operators, how many items each list
holds, its true/false values, its order — and not on its numbers and words. So each process
compiles a shape once and runs that statement with each search's own values as parameters:
another price, region or page is the same statement, and no row is ever reused.

The ORM still writes every statement (``offer_query.apply``): a search's values go in as
``Slot`` expressions, which compile to parameters that say which value goes where.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Expression

from marketplace import offer_index, offer_query
from marketplace.models import Offer


class Slot(Expression):
    """The place of a search's ``position``-th value in its compiled statement."""

    def __init__(self, position: int, output_field):
        super().__init__(output_field=output_field)
        self.position = position

    def as_sql(self, compiler, connection):
        return "%s", [self]


@dataclass(frozen=True)
class Statement:
    """A shape's SQL with its page left as the two last parameters, and its parameters:
    a ``Slot`` where a search's value goes."""

    sql: str
    params: tuple


def search_columns(
    query: offer_query.OfferQuery, columns: tuple[str, ...], limit: int, offset: int
) -> dict[str, list]:
    """A page of the search's offers, in its order, as a list of values per column: the
    index's arrays give a page that way, and the page's JSON is built a field at a time."""
    found = offer_index.page_columns(query, limit, offset, columns)
    if found is not None:
        return found
    rows = _sql_rows(query, columns, limit, offset)
    return {name: [row[name] for row in rows] for name in columns}


def search_rows(
    query: offer_query.OfferQuery, columns: tuple[str, ...], limit: int, offset: int
) -> list[dict]:
    """A page of the search's offers as rows (dicts of ``columns``), in its order."""
    rows = offer_index.page_rows(query, limit, offset, columns)
    return rows if rows is not None else _sql_rows(query, columns, limit, offset)


def _sql_rows(
    query: offer_query.OfferQuery, columns: tuple[str, ...], limit: int, offset: int
) -> list[dict]:
    """``search_rows`` answered by PostgreSQL (or SQLite)."""
    connection = connections[Offer.objects.db]
    query = offer_query.resolve_families(query)
    shape = _shape(query)
    # On other databases than PostgreSQL (SQLite embedded) a lookup may rewrite its value
    # while compiling (iexact escapes it for LIKE) and rows need the backend's converters:
    # there the ORM composes every search.
    statement = _statement(shape, columns) if shape and connection.vendor == "postgresql" else None
    if statement is None:
        found = offer_query.apply(Offer.objects.all(), query).values(*columns)
        return list(found[offset : offset + limit])
    values = _values(query)
    params = [values[p.position] if isinstance(p, Slot) else p for p in statement.params]
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, [*params, limit, offset])
        rows = cursor.fetchall()
    return [_row(columns, row, connection) for row in rows]


def _shape(query: offer_query.OfferQuery) -> tuple | None:
    """What the search's statement depends on, as a hashable value; None for a search on
    ``duration``, whose condition counts from the moment of the search, and for a GPU family
    left unresolved (``resolve_families``), matched by prefix."""
    filters = []
    for name, condition in query.filters.items():
        if condition is None:  # ``field=any``: the default filter dropped
            filters.append((name, None))
            continue
        if name == "gpu_model":
            filters.append((name, *condition[:1], _value_shape(condition[1])))
            continue
        if offer_query.FIELDS[name].kind in ("days", "gpu"):
            return None
        op, value = condition
        filters.append((name, op, _value_shape(value)))
    return tuple(filters), tuple(query.order)


def _value_shape(value: Any):
    """A list has one place per item. True and false stay in the statement (the ORM writes
    ``WHERE rentable``, which the partial indexes' condition matches); any other value is a
    place, kept apart by its type."""
    if isinstance(value, list):
        return tuple(_value_shape(item) for item in value)
    if isinstance(value, bool):
        return value
    return type(value)


def _values(query: offer_query.OfferQuery) -> list:
    """The search's values in the order of their places (``_template``)."""
    values = []
    for condition in query.filters.values():
        if condition is None:
            continue
        _, value = condition
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, bool):
                values.append(item)
    return values


@functools.lru_cache(maxsize=256)
def _statement(shape: tuple, columns: tuple[str, ...]) -> Statement | None:
    """The ORM's statement for a shape, without its page; None where the ORM must compose
    each search: the statement would not hold every value as a parameter of its own (a
    lookup rewrote one while compiling), or the ORM found that nothing can match."""
    places = itertools.count()
    try:
        sql, params = _template(shape, places).values(*columns).query.sql_with_params()
    except EmptyResultSet:
        return None
    held = sorted(param.position for param in params if isinstance(param, Slot))
    if held != list(range(next(places))):
        return None
    return Statement(sql=f"{sql} LIMIT %s OFFSET %s", params=tuple(params))


def _template(shape: tuple, places):
    """The search's queryset with a ``Slot`` for each of its values, numbered by ``places``."""
    filters, order = shape
    conditions = {}
    for name, *condition in filters:
        if condition == [None]:
            conditions[name] = None
            continue
        op, value_shape = condition
        field = _output_field(name)
        conditions[name] = (op, _slotted(value_shape, places, field))
    template = offer_query.OfferQuery(filters=conditions, order=list(order))
    return offer_query.apply(Offer.objects.all(), template)


def _slotted(value_shape, places, field):
    if isinstance(value_shape, tuple):
        return [_slotted(item, places, field) for item in value_shape]
    if isinstance(value_shape, bool):
        return value_shape
    return Slot(next(places), field)


def _output_field(name: str):
    if name == "gpu_model":
        return Offer._meta.get_field("gpu_name")
    if name in offer_query.ANNOTATIONS:
        return offer_query.ANNOTATIONS[name].output_field
    return Offer._meta.get_field(offer_query.FIELDS[name].column)


_CARDS = Offer._meta.get_field("cards")


def _row(columns: tuple[str, ...], row: tuple, connection) -> dict:
    """A row as the ORM's ``values()`` gives it: on PostgreSQL the one column to convert is
    ``cards``' JSON text (most machines share no cards: their ``[]`` needs no parser)."""
    found = dict(zip(columns, row, strict=True))
    if "cards" in found:
        cards = found["cards"]
        found["cards"] = [] if cards == "[]" else _CARDS.from_db_value(cards, None, connection)
    return found
