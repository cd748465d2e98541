"""Database connections around slow I/O.

Why it exists: a request that waits on a host (SSH, a container's logs) would hold its
pooled database connection for the whole wait, and a handful of such requests would starve
every other request of connections. Giving it back first is a rule of the connection, not of
any app, so it lives here.
"""

from __future__ import annotations

from django.db import connection


def release_database_connection() -> None:
    """Give this thread's database connection back (to the pool) before slow host I/O in a
    request, so a request waiting on SSH holds no connection meanwhile; Django opens one again
    at the next query. Inside a transaction it is kept (closing would end the transaction)."""
    if not connection.in_atomic_block:
        connection.close()
