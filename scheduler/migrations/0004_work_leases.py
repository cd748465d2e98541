"""One lease for the work of every transitional state (launch, stop, destroy), and the two new
states that a stop and a destroy wait in until the host confirms."""

from django.db import migrations, models
from django.db.models import Q


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0003_private_repository")]

    operations = [
        migrations.RenameField("instance", "launch_claim", "lease_token"),
        migrations.RenameField("instance", "launch_claimed_at", "lease_expires_at"),
        migrations.RenameField("instance", "launch_attempts", "attempts"),
        # A claim's start is not its expiry: drop any claim in flight (its task retries).
        migrations.RunSQL(
            "UPDATE scheduler_instance SET lease_token = '', lease_expires_at = NULL",
            migrations.RunSQL.noop,
        ),
        migrations.AddField(
            model_name="instance",
            name="work_due_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="instance",
            name="state",
            field=models.CharField(
                choices=[
                    ("launching", "Launching"),
                    ("running", "Running"),
                    ("exited", "Exited"),
                    ("stopping", "Stopping"),
                    ("stopped", "Stopped"),
                    ("failed", "Failed"),
                    ("expired", "Expired"),
                    ("destroying", "Destroying"),
                    ("destroyed", "Destroyed"),
                ],
                default="launching",
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="instance",
            constraint=models.CheckConstraint(
                condition=Q(
                    state__in=[
                        "launching",
                        "running",
                        "exited",
                        "stopping",
                        "stopped",
                        "failed",
                        "expired",
                        "destroying",
                        "destroyed",
                    ]
                ),
                name="instance_state_known",
            ),
        ),
        migrations.AddConstraint(
            model_name="instance",
            constraint=models.CheckConstraint(
                condition=Q(launch_mode__in=["entrypoint", "ssh", "jupyter"]),
                name="instance_launch_mode_known",
            ),
        ),
    ]
