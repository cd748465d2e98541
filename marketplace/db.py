"""Database helpers for requests that wait on a host."""

from __future__ import annotations

from django.db import connection


def release_database_connection() -> None:
    """Give this thread's database connection back (to the pool) before slow host I/O in a
    request, so a request waiting on SSH holds no connection meanwhile; Django opens one again
    at the next query. Inside a transaction it is kept (closing would end the transaction)."""
    if not connection.in_atomic_block:
        connection.close()
