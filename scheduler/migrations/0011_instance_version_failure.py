from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0010_instance_versions")]

    operations = [
        migrations.AddField(
            model_name="instanceversion",
            name="failure",
            field=models.CharField(blank=True, max_length=500),
        ),
    ]
