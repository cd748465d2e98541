"""Test databases (and the benches' scratch databases) are copies of a template migrated once
per set of migrations (core/migrated_template.py)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from core import migrated_template


@pytest.mark.django_db
def test_this_workers_database_is_a_copy_of_the_current_template_and_fully_migrated():
    if connection.vendor != "postgresql" or not migrated_template.enabled():
        pytest.skip("templates are PostgreSQL's, and MIGRATED_TEMPLATE=0 turns them off")
    database = settings.DATABASES["default"]
    template = database["TEST"]["TEMPLATE"]
    assert template.endswith(f"_tpl_{migrated_template.migrations_digest()}")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT datallowconn FROM pg_database WHERE datname = %s", [template]
        )  # nobody may sit on it: PostgreSQL copies no template someone is connected to
        assert cursor.fetchone() == (False,)
        cursor.execute("SELECT app, name FROM django_migrations")
        applied = set(cursor.fetchall())
    on_disk = set(MigrationLoader(None, ignore_no_migrations=True).disk_migrations)
    assert on_disk <= applied


def test_the_digest_changes_with_any_migration_django_or_file(tmp_path):
    files = {}
    for name, text in [("0001_initial", "a = 1\n"), ("0002_more", "b = 2\n")]:
        files[name] = tmp_path / f"{name}.py"
        files[name].write_text(text)
    migrations = [("billing", name, path) for name, path in files.items()]
    digest = migrated_template.digest_of("5.2", migrations)

    assert migrated_template.digest_of("5.2", list(reversed(migrations))) == digest
    assert migrated_template.digest_of("5.2.1", migrations) != digest
    assert migrated_template.digest_of("5.2", migrations[:1]) != digest
    assert migrated_template.digest_of("5.2", [("hosts", *m[1:]) for m in migrations]) != digest
    files["0002_more"].write_text("b = 3\n")
    assert migrated_template.digest_of("5.2", migrations) != digest


def test_a_template_name_fits_postgresqls_63_bytes():
    name = migrated_template.template_name("x" * 80, "0123456789abcdef")
    assert len(name) == 63 and name.endswith("_tpl_0123456789abcdef")
    assert migrated_template.template_name("gpumkt_ns3", "0123456789abcdef") == (
        "gpumkt_ns3_tpl_0123456789abcdef"
    )
