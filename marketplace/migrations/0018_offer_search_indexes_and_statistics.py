"""Offer search at a million offers (bench/offer_search.py, issue 17).

- The GPU-by-price index carries the free units after the price: a units filter is checked
  inside the index rather than on every cheaper offer's row.
- A region-by-score index, for searches that pick a region and sort by score.
- Statistics on the upper-cased GPU model and region, the expressions search compares:
  PostgreSQL keeps none for a partial index's expressions, and without them it guessed that
  a GPU model matches 0.5 % of offers and chose plans that fetch and sort thousands of rows.

Built concurrently, so offers stay writable while the indexes build.
"""

import django.db.models.functions.text
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

STATISTICS = [
    ("offer_gpu_name_upper", "upper(gpu_name::text)"),
    ("offer_geolocation_upper", "upper(geolocation::text)"),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("hosts", "0008_machine_disk_enforced"),
        ("marketplace", "0017_volume_states_off_the_transaction"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="offer",
            index=models.Index(
                django.db.models.functions.text.Upper("gpu_name"),
                models.F("dph_total"),
                models.F("num_gpus"),
                condition=models.Q(("rentable", True)),
                name="offer_gpu_by_price_units",
            ),
        ),
        RemoveIndexConcurrently(model_name="offer", name="offer_gpu_by_price"),
        AddIndexConcurrently(
            model_name="offer",
            index=models.Index(
                django.db.models.functions.text.Upper("geolocation"),
                models.OrderBy(models.F("score"), descending=True),
                models.F("machine"),
                condition=models.Q(("rentable", True)),
                name="offer_region_by_score",
            ),
        ),
        *(
            migrations.RunSQL(
                f"CREATE STATISTICS {name} ON ({expression}) FROM marketplace_offer",
                f"DROP STATISTICS IF EXISTS {name}",
            )
            for name, expression in STATISTICS
        ),
        migrations.RunSQL("ANALYZE marketplace_offer", migrations.RunSQL.noop),
    ]
