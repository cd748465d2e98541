"""Fresh PostgreSQL databases copied from a migrated template, not migrated one by one.

Why it exists: migrating an empty database runs every migration (about a hundred), and
Django renders the models' state again at nearly every step: 20 s of one core on the 2-core
development machine. The test suite makes such a database for each of its workers and every
bench makes one, so on a machine whose two cores the suite keeps busy that was minutes of
each run. A copy (``CREATE DATABASE … TEMPLATE``) takes a fraction of a second, and
``migrate`` on it then finds nothing to do (about a second, most of it Django's start).

The template is made by ``manage.py migrate`` itself, once per set of migrations: its name
carries a digest of every migration file Django loads (ours and the libraries'), so a changed
or added migration makes a new template and a copy is never of an older schema. Templates
of other digests under the same name are dropped when a new one is made; the current one is
kept for the next run, and refuses connections, since a session on a template keeps
PostgreSQL from copying it. An advisory lock keeps processes that want the same template
(the suite's workers) from making it twice. Off switch: ``MIGRATED_TEMPLATE=0``, and every
database is migrated from empty as before.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

ROOT = Path(__file__).resolve().parents[1]
SUFFIX = "_tpl_"


def enabled() -> bool:
    return os.environ.get("MIGRATED_TEMPLATE", "1") != "0"


def migrations_digest() -> str:
    """The digest (``digest_of``) of every migration Django loads from disk."""
    import django
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True, load=False)
    loader.load_disk()
    return digest_of(
        django.get_version(),
        (
            (app_label, name, Path(sys.modules[type(migration).__module__].__file__ or ""))
            for (app_label, name), migration in loader.disk_migrations.items()
        ),
    )


def digest_of(django_version: str, migrations: Iterable[tuple[str, str, Path]]) -> str:
    """16 hex digits over Django's version (it writes the SQL) and each migration's app,
    name and file, in order of app and name."""
    digest = hashlib.sha256(django_version.encode())
    for app_label, name, source in sorted(migrations):
        digest.update(f"\0{app_label}\0{name}\0".encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def template_name(base: str, digest: str) -> str:
    """The template for databases named after ``base``: PostgreSQL names end at 63 bytes."""
    return f"{base[: 63 - len(SUFFIX) - len(digest)]}{SUFFIX}{digest}"


def template_ensure(settings: Mapping[str, Any], base: str) -> str:
    """The name of the migrated template for ``base`` on the server ``settings`` (a Django
    database's HOST, PORT, USER, PASSWORD), made now if there is none."""
    name = template_name(base, migrations_digest())
    with _admin(settings) as admin:
        # One maker at a time; the others wait here, then find it made.
        admin.execute("SELECT pg_advisory_lock(%s)", [zlib.crc32(name.encode())])
        if _exists(admin, name):
            return name
        building = f"{name[:55]}_making"
        admin.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{building}"')
        _migrate(settings, building)
        admin.execute(f'ALTER DATABASE "{building}" WITH ALLOW_CONNECTIONS false')
        # The migrating process has exited, but its server sessions may not have ended yet,
        # and a rename fails rather than wait for them: ended here, waited for (5 s at most).
        admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = %s",
            [building],
        )
        admin.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
        for (stale,) in admin.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s) AND datname <> %s",
            [name.rpartition(SUFFIX)[0] + SUFFIX, name],
        ).fetchall():
            admin.execute(f'DROP DATABASE IF EXISTS "{stale}" WITH (FORCE)')
    return name


def database_create(settings: Mapping[str, Any], name: str, template: str | None) -> None:
    """CREATE DATABASE ``name``, a copy of ``template`` where one is given."""
    with _admin(settings) as admin:
        suffix = f' TEMPLATE "{template}"' if template else ""
        admin.execute(f'CREATE DATABASE "{name}"{suffix}')


def _exists(admin: psycopg.Connection, name: str) -> bool:
    return bool(admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone())


def _admin(settings: Mapping[str, Any]) -> psycopg.Connection:
    return psycopg.connect(
        host=settings.get("HOST") or None,
        port=settings.get("PORT") or None,
        user=settings.get("USER") or None,
        password=settings.get("PASSWORD") or None,
        dbname="postgres",
        autocommit=True,
    )


def _migrate(settings: Mapping[str, Any], name: str) -> None:
    """``manage.py migrate`` into ``name``, in a process of its own: the caller's Django may
    be set up on another database (a test worker's, a bench's)."""
    user = quote(settings.get("USER") or "", safe="")
    password = quote(settings.get("PASSWORD") or "", safe="")
    credentials = f"{user}:{password}@" if user else ""
    url = f"postgres://{credentials}{settings.get('HOST') or ''}:{settings.get('PORT') or 5432}/{name}"
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        check=True,
    )
