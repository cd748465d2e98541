"""Which database the money tests run on. scripts/test.sh runs them on PostgreSQL (production)
and again on SQLite (``make run``'s embedded default), so the ledger's SQLite branches run too;
a test of something only PostgreSQL has is skipped on SQLite, saying what."""

from __future__ import annotations

import pytest
from django.db import connection

ON_SQLITE = connection.vendor == "sqlite"


def postgresql_only(what: str):
    """Skip on SQLite: ``what`` exists on PostgreSQL only."""
    return pytest.mark.skipif(ON_SQLITE, reason=f"PostgreSQL only: {what}")


# billing/migrations/0002 and 0005 install these as PostgreSQL triggers; SQLite gets none (the
# services keep the same rules in code).
LEDGER_TRIGGERS = postgresql_only("the ledger's database triggers (billing migrations 0002, 0005)")
