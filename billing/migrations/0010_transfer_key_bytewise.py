"""Transfers' idempotency keys compared byte by byte (PostgreSQL's "C" collation) instead of
by the database's locale: a key is only ever looked up for equality, and the metering sweep
inserts 100,000 of them a minute into the unique index, each insert a score of comparisons
that the locale made slower. SQLite compares bytes already."""

from django.db import migrations

BYTEWISE = 'ALTER TABLE billing_transfer ALTER COLUMN idempotency_key TYPE varchar(200) COLLATE "C"'
BY_LOCALE = (
    'ALTER TABLE billing_transfer ALTER COLUMN idempotency_key TYPE varchar(200) COLLATE "default"'
)


def _on_postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0009_transfer_indexes_nobody_reads"),
    ]

    operations = [
        migrations.RunPython(_on_postgresql(BYTEWISE), _on_postgresql(BY_LOCALE)),
    ]
