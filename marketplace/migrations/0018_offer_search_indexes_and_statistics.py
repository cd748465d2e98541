"""Offer search at a million offers (bench/offer_search.py, issue 17).

- The GPU-by-price index carries the free units after the price: a units filter is checked
  inside the index rather than on every cheaper offer's row.
- A region-by-score index, for searches that pick a region and sort by score.
- Statistics on the upper-cased GPU model and region, the expressions search compares:
  PostgreSQL keeps none for a partial index's expressions, and without them it guessed that
  a GPU model matches 0.5 % of offers and chose plans that fetch and sort thousands of rows.

Built concurrently on PostgreSQL, so offers stay writable while the indexes build; the
embedded SQLite default builds them plainly and has no statistics objects.
"""

import django.db.models.functions.text
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

STATISTICS = [
    ("offer_gpu_name_upper", "upper(gpu_name::text)"),
    ("offer_geolocation_upper", "upper(geolocation::text)"),
]


def _postgresql(schema_editor) -> bool:
    return schema_editor.connection.vendor == "postgresql"


class AddIndexWhileWritable(AddIndexConcurrently):
    """CREATE INDEX CONCURRENTLY on PostgreSQL; a plain index elsewhere (SQLite)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if _postgresql(schema_editor):
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_forwards(
            self, app_label, schema_editor, from_state, to_state
        )

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if _postgresql(schema_editor):
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_backwards(
            self, app_label, schema_editor, from_state, to_state
        )


class RemoveIndexWhileWritable(RemoveIndexConcurrently):
    """DROP INDEX CONCURRENTLY on PostgreSQL; a plain drop elsewhere (SQLite)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if _postgresql(schema_editor):
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return migrations.RemoveIndex.database_forwards(
            self, app_label, schema_editor, from_state, to_state
        )

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if _postgresql(schema_editor):
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return migrations.RemoveIndex.database_backwards(
            self, app_label, schema_editor, from_state, to_state
        )


def statistics_create(apps, schema_editor):
    if not _postgresql(schema_editor):
        return
    for name, expression in STATISTICS:
        schema_editor.execute(f"CREATE STATISTICS {name} ON ({expression}) FROM marketplace_offer")
    schema_editor.execute("ANALYZE marketplace_offer")


def statistics_drop(apps, schema_editor):
    if not _postgresql(schema_editor):
        return
    for name, _ in STATISTICS:
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("hosts", "0008_machine_disk_enforced"),
        ("marketplace", "0017_volume_states_off_the_transaction"),
    ]

    operations = [
        AddIndexWhileWritable(
            model_name="offer",
            index=models.Index(
                django.db.models.functions.text.Upper("gpu_name"),
                models.F("dph_total"),
                models.F("num_gpus"),
                condition=models.Q(("rentable", True)),
                name="offer_gpu_by_price_units",
            ),
        ),
        RemoveIndexWhileWritable(model_name="offer", name="offer_gpu_by_price"),
        AddIndexWhileWritable(
            model_name="offer",
            index=models.Index(
                django.db.models.functions.text.Upper("geolocation"),
                models.OrderBy(models.F("score"), descending=True),
                models.F("machine"),
                condition=models.Q(("rentable", True)),
                name="offer_region_by_score",
            ),
        ),
        migrations.RunPython(statistics_create, statistics_drop),
    ]
