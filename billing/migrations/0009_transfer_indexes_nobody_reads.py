"""Two indexes on transfers that no query reads, maintained on every insert (the metering sweep
inserts 100,000 transfers a minute): ``reference`` is only searched by substring (the ledger
filter, the admin), which a b-tree cannot serve; nothing looks transfers up by their hold."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0008_rental_references"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="transfer",
            name="billing_transfer_reference",
        ),
        migrations.AlterField(
            model_name="transfer",
            name="hold",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="transfers",
                to="billing.hold",
            ),
        ),
    ]
