"""Offers become GPU-count bundles (issue 32): a machine has one offer per bundle size, each
with its own id, so the machine is no longer the offer's primary key.

The existing rows are each machine's offer of all its free GPUs (``all_free``); the next
refresh of a machine adds its other bundles. The machine column keeps its name and values;
on PostgreSQL its primary key constraint is dropped first (altering the field alone leaves
it). The four indexes that ended on the machine end on the new id.
"""

import django.db.models.deletion
import django.db.models.functions.text
from django.db import migrations, models


def machine_primary_key_drop(apps, schema_editor):
    """PostgreSQL keeps the machine column's primary key through ``AlterField``; drop it so
    the new id can be the key. SQLite rebuilds the table from the model instead."""
    if schema_editor.connection.vendor != "postgresql":
        return
    offer = apps.get_model("marketplace", "Offer")
    for name in schema_editor._constraint_names(offer, primary_key=True):
        schema_editor.execute(f'ALTER TABLE marketplace_offer DROP CONSTRAINT "{name}"')


class Migration(migrations.Migration):
    dependencies = [
        ("hosts", "0012_machine_firewall_ranges"),
        ("marketplace", "0018_offer_search_indexes_and_statistics"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="offer",
            name="offer_by_score",
        ),
        migrations.RemoveIndex(
            model_name="offer",
            name="offer_by_price",
        ),
        migrations.RemoveIndex(
            model_name="offer",
            name="offer_by_reliability",
        ),
        migrations.RemoveIndex(
            model_name="offer",
            name="offer_region_by_score",
        ),
        migrations.RunPython(machine_primary_key_drop, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="offer",
            name="machine",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="offers",
                to="hosts.machine",
            ),
        ),
        migrations.AddField(
            model_name="offer",
            name="id",
            field=models.BigAutoField(
                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
            ),
        ),
        migrations.AddField(
            model_name="offer",
            name="all_free",
            field=models.BooleanField(
                default=True,
                help_text="the bundle of all the machine's free GPUs (one per machine)",
            ),
        ),
        migrations.AddField(
            model_name="offer",
            name="cpu_cores",
            field=models.PositiveIntegerField(default=0, help_text="the machine's CPU cores"),
        ),
        migrations.AddField(
            model_name="offer",
            name="datacenter",
            field=models.BooleanField(
                default=False, help_text="the provider is a certified datacenter (none is yet)"
            ),
        ),
        migrations.AddField(
            model_name="offer",
            name="direct_port_count",
            field=models.PositiveIntegerField(
                default=0, help_text="host ports the machine publishes rentals' ports from"
            ),
        ),
        migrations.AddField(
            model_name="offer",
            name="rented",
            field=models.BooleanField(
                default=False,
                help_text="some of the bundle's GPUs are rented now (it does not fit)",
            ),
        ),
        migrations.AddField(
            model_name="offer",
            name="static_ip",
            field=models.BooleanField(
                default=False, help_text="reached at a fixed IP address, not a host name"
            ),
        ),
        migrations.AlterField(
            model_name="offer",
            name="dph_total",
            field=models.BigIntegerField(help_text="micro-dollars per hour for the bundle"),
        ),
        migrations.AlterField(
            model_name="offer",
            name="end_date",
            field=models.DateTimeField(
                blank=True,
                help_text="the end of the offer: the machine's end date or the start of its next maintenance window, whichever comes first",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="offer",
            name="num_gpus",
            field=models.PositiveSmallIntegerField(help_text="GPUs of this bundle"),
        ),
        migrations.AddIndex(
            model_name="offer",
            index=models.Index(
                models.OrderBy(models.F("score"), descending=True),
                models.F("id"),
                condition=models.Q(("rentable", True)),
                name="offer_by_score",
            ),
        ),
        migrations.AddIndex(
            model_name="offer",
            index=models.Index(
                models.F("dph_total"),
                models.F("id"),
                condition=models.Q(("rentable", True)),
                name="offer_by_price",
            ),
        ),
        migrations.AddIndex(
            model_name="offer",
            index=models.Index(
                models.OrderBy(models.F("reliability"), descending=True),
                models.F("id"),
                condition=models.Q(("rentable", True)),
                name="offer_by_reliability",
            ),
        ),
        migrations.AddIndex(
            model_name="offer",
            index=models.Index(
                django.db.models.functions.text.Upper("geolocation"),
                models.OrderBy(models.F("score"), descending=True),
                models.F("id"),
                condition=models.Q(("rentable", True)),
                name="offer_region_by_score",
            ),
        ),
        migrations.AddConstraint(
            model_name="offer",
            constraint=models.UniqueConstraint(
                fields=("machine", "num_gpus"), name="offer_one_per_size"
            ),
        ),
    ]
