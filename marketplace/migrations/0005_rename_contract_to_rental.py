"""One word per concept: the model ``Contract`` is now ``Rental`` (table, related names and
constraint names follow). Rows, ids and holds are unchanged; the table is renamed in place."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("hosts", "0006_machine_allow_private_registries"),
        ("marketplace", "0004_offer_search_indexes"),
        ("scheduler", "0001_initial"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="contract", name="contract_gpus_min1"),
        migrations.RemoveConstraint(model_name="contract", name="contract_ends_after"),
        migrations.RenameModel(old_name="Contract", new_name="Rental"),
        migrations.AlterField(
            model_name="rental",
            name="instance",
            field=models.OneToOneField(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="rental",
                to="scheduler.instance",
            ),
        ),
        migrations.AlterField(
            model_name="rental",
            name="machine",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="rentals",
                to="hosts.machine",
            ),
        ),
        migrations.AlterField(
            model_name="rental",
            name="provider_team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="provided_rentals",
                to="marketplace.team",
            ),
        ),
        migrations.AlterField(
            model_name="rental",
            name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="rentals",
                to="marketplace.team",
            ),
        ),
        migrations.RenameIndex(
            model_name="rental",
            new_name="marketplace_settled_ed4986_idx",
            old_name="marketplace_settled_8fa0fa_idx",
        ),
        migrations.AddConstraint(
            model_name="rental",
            constraint=models.CheckConstraint(
                condition=models.Q(("gpu_count__gte", 1)), name="rental_gpus_min1"
            ),
        ),
        migrations.AddConstraint(
            model_name="rental",
            constraint=models.CheckConstraint(
                condition=models.Q(("ends_at__gt", models.F("starts_at"))),
                name="rental_ends_after",
            ),
        ),
    ]
