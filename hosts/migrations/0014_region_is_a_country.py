"""A machine's region becomes a country (ISO 3166-1 alpha-2), as the listing form now offers.

Free text is mapped where it names one: a code in any case ("us"), an alpha-3 code ("DEU"), a
name ("Germany"), UK/USA, or vast.ai's "place, CODE" ("Quebec, CA"). Anything else ("Mars
Base Alpha", a continent like "EU") names no country: the region is cleared, so the machine is
listed with no region until its provider chooses one, and its events say so with the text it
had. Nothing else about the machine changes; offers follow in marketplace's 0023.
"""

from django.db import migrations


def regions_to_countries(apps, schema_editor):
    from hosts.countries import country_code

    Machine = apps.get_model("hosts", "Machine")
    MachineEvent = apps.get_model("hosts", "MachineEvent")
    for machine in Machine.objects.exclude(location="").only("pk", "location").iterator():
        code = country_code(machine.location) or ""
        if code == machine.location:
            continue
        Machine.objects.filter(pk=machine.pk).update(location=code)
        if code:
            message = f"Region '{machine.location}' is now the country {code}."
        else:
            message = (
                f"Region '{machine.location}' names no country and was cleared: "
                "choose the machine's country in its listing terms."
            )
        MachineEvent.objects.create(machine_id=machine.pk, kind="terms", message=message[:500])


class Migration(migrations.Migration):
    dependencies = [("hosts", "0013_verification_and_benchmarks")]

    operations = [migrations.RunPython(regions_to_countries, migrations.RunPython.noop)]
