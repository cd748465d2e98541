"""The gateway's looks at an API key in the database, on the web process's event loop.

A first look at a key (``auth.GatewayAuthFastPath``) used to hop to the one thread the looks
shared and run there through Django's database layer. Under the gateway's load the hop cost
more than the look's query: the loop's thread and the look's thread took turns on the GIL, so
a look whose answer had come back from the database waited for the loop to let go, and the
loop waited for the thread's answer in turn. Here a look is the same statements
(``api_key_lookup_sql``, prepared after a few runs) on an asynchronous psycopg connection that
the process keeps for looks, awaited on the loop itself: no thread, no hop.

PostgreSQL only (``available``); with SQLite, ``make run``'s default, the looks stay on the
thread. The connection is opened at the first look and kept; one that died meanwhile (the
database restarted) costs the next look a new connection, not an error. It shows in
``pg_stat_activity`` as ``APPLICATION_NAME``.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import psycopg
from django.db import connection, connections
from django.utils import timezone

from marketplace.models import ApiKey, Cluster
from marketplace.services.accounts import (
    api_key_accepts,
    api_key_from_row,
    api_key_lookup_sql,
    api_key_prefix,
    api_key_use_due,
)

APPLICATION_NAME = "gpumkt gateway looks"


@functools.cache
def available() -> bool:
    """Whether looks run here (PostgreSQL). Asked on every gateway request; a process's
    database does not change, so asked of Django once."""
    return connection.vendor == "postgresql"


class _Kept:
    """The process's connection for looks, opened on the loop that first looked (a test's
    next loop opens its own)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.opening: asyncio.Lock | None = None
        self.conn: psycopg.AsyncConnection | None = None

    async def get(self) -> psycopg.AsyncConnection:
        loop = asyncio.get_running_loop()
        if self.loop is loop and self.conn is not None and not self.conn.closed:
            return self.conn
        if self.loop is not loop:
            self.drop()
            self.loop, self.opening = loop, asyncio.Lock()
        assert self.opening is not None
        async with self.opening:  # the first looks at once open one connection, not several
            if self.conn is None or self.conn.closed:
                self.conn = await psycopg.AsyncConnection.connect(**_params())
        return self.conn

    def drop(self) -> None:
        """Close the connection (also one of another loop's: libpq's own close needs none)."""
        if self.conn is not None:
            self.conn.pgconn.finish()
        self.conn = None


_kept = _Kept()


def close() -> None:
    """Close the looks' connection (a test's end; the next look opens another)."""
    _kept.drop()


def _params() -> dict[str, Any]:
    """Django's own connection parameters (the database, its user, the adapters that load
    dates as Django does, prepared statements as configured), for an async connection."""
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)  # Django's is a sync cursor
    return {**params, "autocommit": True, "application_name": APPLICATION_NAME}


async def _execute(sql: str, values: list) -> psycopg.AsyncCursor:
    """Run a statement; a connection that died meanwhile is replaced once."""
    try:
        return await (await _kept.get()).execute(sql, values)
    except psycopg.OperationalError:
        _kept.drop()
    return await (await _kept.get()).execute(sql, values)


async def _fetchone(sql: str, values: list) -> tuple | None:
    return await (await _execute(sql, values)).fetchone()


async def cluster_team(cluster_id: int) -> int | None:
    """The team of a cluster, None when there is no such cluster."""
    table, pk = connection.ops.quote_name(Cluster._meta.db_table), Cluster._meta.pk.column
    row = await _fetchone(f"SELECT team_id FROM {table} WHERE {pk} = %s", [cluster_id])  # noqa: S608
    return None if row is None else row[0]


async def api_key(full_key: str) -> ApiKey | None:
    """``api_key_authenticate(full_key, related=False)``, awaited on the loop."""
    prefix = api_key_prefix(full_key)
    row = None if prefix is None else await _fetchone(api_key_lookup_sql(False), [prefix])
    if row is None:
        return None
    key = api_key_from_row(row, related=False)
    if not api_key_accepts(key, full_key):
        return None
    now = timezone.now()
    if api_key_use_due(key, now):
        table, pk = connection.ops.quote_name(ApiKey._meta.db_table), ApiKey._meta.pk.column
        await _execute(f"UPDATE {table} SET last_used_at = %s WHERE {pk} = %s", [now, key.pk])  # noqa: S608
        key.last_used_at = now
    return key
