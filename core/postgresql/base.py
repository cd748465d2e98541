"""Django's PostgreSQL backend, with a pooled connection checked without a round trip.

Why it exists: with psycopg's pool, Django's ``CONN_HEALTH_CHECKS`` makes the pool send an
empty query before handing out each connection, and under ASGI every request takes one from
the pool: a round trip per request, to learn what is nearly always "alive". A connection
PostgreSQL ended (a restart, ``pg_terminate_backend``, a crash) has something to read on its
socket: the server's last message or the end of the stream. So a connection with nothing to
read is handed out as it is, and only one with something waiting gets the pool's check, which
drops it if it is dead. What this cannot see (a network that
went silent) fails that request's first query, as it would without any check.

``DB_POOL_QUIET_CHECK=0`` (settings) goes back to Django's check on every checkout.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


def quietly_alive(connection: psycopg.Connection) -> bool:
    """Whether a pooled connection may be used: nothing waits on its socket, or the pool's
    check (an empty query) passes."""
    if connection.closed or connection.broken:
        return False
    waiting, _, _ = select.select([connection.fileno()], [], [], 0)
    if not waiting:
        return True
    try:
        ConnectionPool.check_connection(connection)
    except psycopg.Error:
        return False
    return True


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> psycopg.Connection:
        connection: psycopg.Connection = super().get_new_connection(conn_params)
        pool: ConnectionPool | None = self.pool  # type: ignore[attr-defined]  # not in the stubs
        if pool is None:
            return connection
        # Each dead one goes back (the pool drops it and opens another); at most the pool's
        # size of them, so a pool of dead connections ends, the last one failing its query.
        for _ in range(pool.max_size):
            if quietly_alive(connection):
                break
            pool.putconn(connection)
            connection = super().get_new_connection(conn_params)
        return connection
