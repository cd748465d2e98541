"""Shared set-up for benches: a scratch PostgreSQL database, migrated, dropped afterwards."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psycopg


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    """Create the database named in DATABASE_URL, set Django up on it, drop it at the end."""
    import dj_database_url

    config = dj_database_url.parse(os.environ["DATABASE_URL"])
    name = config["NAME"]
    admin = psycopg.connect(
        host=config["HOST"], port=config["PORT"] or 5432, user=config["USER"],
        password=config["PASSWORD"], dbname="postgres", autocommit=True,
    )  # fmt: skip
    with admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield name
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(
            host=config["HOST"], port=config["PORT"] or 5432, user=config["USER"],
            password=config["PASSWORD"], dbname="postgres", autocommit=True,
        ) as admin:  # fmt: skip
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
