"""Database connections around slow I/O, and the cursor for statements every request runs.

Why it exists: a request that waits on a host (SSH, a container's logs) would hold its
pooled database connection for the whole wait, and a handful of such requests would starve
every other request of connections. Giving it back first is a rule of the connection, not of
any app, so it lives here; so does preparing a statement on each pooled connection.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.backends.utils import CursorWrapper


def release_database_connection() -> None:
    """Give this thread's database connection back (to the pool) before slow host I/O in a
    request, so a request waiting on SSH holds no connection meanwhile; Django opens one again
    at the next query. Inside a transaction it is kept (closing would end the transaction)."""
    if not connection.in_atomic_block:
        connection.close()


def prepared_cursor() -> CursorWrapper:
    """A cursor for a statement run on every request (the API key lookup, the offer index's
    freshness check). On PostgreSQL one that binds its parameters on the server, so psycopg
    prepares the statement after a few runs (``prepare_threshold``, set while ``DB_POOL`` is
    on) and each pooled connection plans it once: these statements took longer to plan than
    to run. Wrapped as Django wraps its own cursors (errors, query logging, execute
    wrappers); Django's own cursors bind on the client and are never prepared."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    import psycopg

    connection.ensure_connection()
    # django-stubs type the raw cursor these wrap as a wrapper; it is the driver's cursor.
    raw: Any = psycopg.Cursor(connection.connection)
    return (
        connection.make_debug_cursor(raw)
        if connection.queries_logged
        else connection.make_cursor(raw)
    )
