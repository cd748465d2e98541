"""Offers carry their machine's region as hosts' 0014 left it (a country code, or none)."""

from django.db import migrations
from django.db.models import OuterRef, Subquery


def offers_follow_machines(apps, schema_editor):
    Machine = apps.get_model("hosts", "Machine")
    Offer = apps.get_model("marketplace", "Offer")
    region = Machine.objects.filter(pk=OuterRef("machine_id")).values("location")[:1]
    Offer.objects.update(geolocation=Subquery(region))


class Migration(migrations.Migration):
    dependencies = [
        ("marketplace", "0023_serverless"),
        ("hosts", "0014_region_is_a_country"),
    ]

    operations = [migrations.RunPython(offers_follow_machines, migrations.RunPython.noop)]
