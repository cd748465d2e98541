from django.db import migrations, models


def keep_marks_a_login_pull_earned(apps, schema_editor):
    """Marks made before this field were written before the pull, whatever its outcome: a
    made-up login on a public image left one that made every other team's launch of it pull
    again, and fail where the registry refused them. A mark stays (as proven) where a rental
    with a login got a container of that repository on that machine, so its pull with the
    login succeeded and the local copy may be private; the others guard nothing a login put
    there and go."""
    from hosts.runtime import image_repository

    Instance = apps.get_model("scheduler", "Instance")
    InstanceVersion = apps.get_model("scheduler", "InstanceVersion")
    PrivateRepository = apps.get_model("scheduler", "PrivateRepository")
    ran: set[tuple[int, str]] = set()
    with_login = Instance.objects.exclude(registry_credential={})
    for machine_id, image, container_id, credential in with_login.values_list(
        "machine_id", "image", "container_id", "registry_credential"
    ).iterator():
        if credential and container_id:
            ran.add((machine_id, image_repository(image)))
    versions = InstanceVersion.objects.filter(instance__in=with_login).exclude(container_id="")
    for machine_id, spec, credential in versions.values_list(
        "instance__machine_id", "spec", "instance__registry_credential"
    ).iterator():
        if credential and isinstance(spec, dict) and spec.get("image"):
            ran.add((machine_id, image_repository(spec["image"])))
    for mark in PrivateRepository.objects.all().iterator():
        if (mark.machine_id, mark.repository) in ran:
            mark.proven_at = mark.first_pulled_at
            mark.save(update_fields=["proven_at"])
        else:
            mark.delete()


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0011_instance_version_failure"),
    ]

    operations = [
        migrations.AddField(
            model_name="privaterepository",
            name="proven_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(keep_marks_a_login_pull_earned, migrations.RunPython.noop),
    ]
