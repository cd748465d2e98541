"""Deployments: a team states what to run and on which conditions, not on which machine; the
reconciler (``marketplace.deployments``) places replicas as rentals and keeps them.

A replica is one container a deployment wants. While queued it has no instance and holds
nothing; once placed it is an ordinary rental (its instance, hold and metering), and its state
follows that instance until it ends. An ended replica is never started again: a replacement is
a new replica.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from scheduler.models import LaunchMode
from scheduler.placement import SliceSize


class DeploymentMode(models.TextChoices):
    REPLICASET = "replicaset", "Replica set"  # keep `replica_count` running
    JOB = "job", "Job"  # run to `completions` exits with 0, `replica_count` at a time
    CONTAINER = "container", "Container"  # a job of one


class DeploymentState(models.TextChoices):
    ACTIVE = "active", "Active"
    COMPLETED = "completed", "Completed"  # a job reached its completions
    FAILED = "failed", "Failed"  # a job failed more often than its backoff limit
    STOPPED = "stopped", "Stopped"  # stopped by the team


class PlacementPolicy(models.TextChoices):
    SPREAD = "spread", "Spread"  # replicas on different machines where possible
    BINPACK = "binpack", "Binpack"  # the machines with the fewest free GPUs first


class Deployment(models.Model):
    team = models.ForeignKey(
        "marketplace.Team", on_delete=models.CASCADE, related_name="deployments"
    )
    name = models.CharField(max_length=80)
    mode = models.CharField(
        max_length=16, choices=DeploymentMode.choices, default=DeploymentMode.REPLICASET
    )
    state = models.CharField(
        max_length=16, choices=DeploymentState.choices, default=DeploymentState.ACTIVE
    )
    # The container spec, as for a rental.
    image = models.CharField(max_length=255)
    launch_mode = models.CharField(
        max_length=16, choices=LaunchMode.choices, default=LaunchMode.ENTRYPOINT
    )
    entrypoint = models.CharField(max_length=255, blank=True)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    ports = models.JSONField(default=list, blank=True)
    disk_gb = models.PositiveIntegerField(default=50)
    # Conditions a machine must meet to run a replica.
    gpu_names = models.JSONField(default=list, blank=True, help_text="any model when empty")
    gpus_per_replica = models.PositiveSmallIntegerField(default=1)
    # A slice of one card per replica instead of whole GPUs (gpus_per_replica is then 1), on
    # machines that share their cards; card_policy picks the card (binpack: the fullest that
    # fits, spread: the emptiest) after ``policy`` picked the machine.
    slice_core_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    slice_memory_mb = models.PositiveIntegerField(null=True, blank=True)
    card_policy = models.CharField(max_length=16, default="binpack")
    max_price_per_gpu_hour = models.BigIntegerField(
        null=True, blank=True, help_text="micro-dollars; no cap when null"
    )
    regions = models.JSONField(default=list, blank=True, help_text="any region when empty")
    min_reliability = models.FloatField(default=0.0)
    policy = models.CharField(
        max_length=16, choices=PlacementPolicy.choices, default=PlacementPolicy.SPREAD
    )
    # How many, and for how long each replica's rental holds credit.
    # The API's `replicas` (the reverse relation of Replica is `replicas`).
    replica_count = models.PositiveIntegerField(default=1, help_text="running at once")
    completions = models.PositiveIntegerField(default=1, help_text="jobs: exits with 0 wanted")
    backoff_limit = models.PositiveIntegerField(default=6, help_text="jobs: failures tolerated")
    duration_hours = models.FloatField(default=1.0)
    budget = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="micro-dollars its rentals may spend or hold; no cap when null",
    )
    queue_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(mode__in=DeploymentMode.values), name="deployment_mode_known"
            ),
            models.CheckConstraint(
                condition=Q(state__in=DeploymentState.values), name="deployment_state_known"
            ),
            models.CheckConstraint(
                condition=Q(policy__in=PlacementPolicy.values), name="deployment_policy_known"
            ),
            models.CheckConstraint(
                condition=Q(gpus_per_replica__gte=1), name="deployment_gpus_min1"
            ),
            models.CheckConstraint(
                condition=Q(completions__gte=1), name="deployment_completions_min1"
            ),
            models.CheckConstraint(condition=Q(disk_gb__gte=1), name="deployment_disk_min1"),
            models.CheckConstraint(
                condition=Q(slice_core_percent=None, slice_memory_mb=None)
                | Q(
                    gpus_per_replica=1,
                    slice_core_percent__gte=1,
                    slice_core_percent__lte=100,
                    slice_memory_mb__gte=1,
                ),
                name="deployment_whole_gpus_or_one_slice",
            ),
            models.CheckConstraint(
                condition=Q(card_policy__in=["binpack", "spread"]),
                name="deployment_card_policy_known",
            ),
            models.CheckConstraint(
                condition=Q(duration_hours__gt=0), name="deployment_hours_positive"
            ),
            models.CheckConstraint(
                condition=Q(max_price_per_gpu_hour=None) | Q(max_price_per_gpu_hour__gte=0),
                name="deployment_price_cap_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(budget=None) | Q(budget__gte=0), name="deployment_budget_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"deployment {self.pk} ({self.name})"

    @property
    def is_job(self) -> bool:
        return self.mode in (DeploymentMode.JOB, DeploymentMode.CONTAINER)

    @property
    def gpu_slice(self) -> SliceSize | None:
        """The slice each replica takes, or None for whole GPUs."""
        if self.slice_core_percent is None:
            return None
        return SliceSize(self.slice_core_percent, self.slice_memory_mb)


class ReplicaState(models.TextChoices):
    QUEUED = "queued", "Queued"  # wanted, no machine yet; holds nothing
    PLACED = "placed", "Placed"  # rented; its container is launching
    RUNNING = "running", "Running"
    # Ended (final): a replica never runs again; the deployment places a new one if needed.
    SUCCEEDED = "succeeded", "Succeeded"  # its container exited with 0
    FAILED = "failed", "Failed"  # exited non-zero, or its launch failed
    STOPPED = "stopped", "Stopped"  # stopped by the team or the reconciler (scale down, change)
    LOST = "lost", "Lost"  # its machine went offline, its container vanished or its rental ended


LIVE_REPLICA_STATES = (ReplicaState.QUEUED, ReplicaState.PLACED, ReplicaState.RUNNING)
PLACED_REPLICA_STATES = (ReplicaState.PLACED, ReplicaState.RUNNING)


class Replica(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="replicas")
    instance = models.OneToOneField(
        "scheduler.Instance",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="replica",
        help_text="its rental's instance; null while queued",
    )
    state = models.CharField(
        max_length=16, choices=ReplicaState.choices, default=ReplicaState.QUEUED
    )
    spec_hash = models.CharField(
        max_length=64,
        blank=True,
        help_text="the container spec its rental runs (conditions.spec_hash); blank while queued",
    )
    reason = models.CharField(max_length=300, blank=True, help_text="why it ended")
    exit_code = models.SmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "pk"]
        indexes = [models.Index(fields=["deployment", "state"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=ReplicaState.values), name="replica_state_known"
            ),
            # A replica past the queue has its rental, and a queued one has none.
            models.CheckConstraint(
                condition=Q(state=ReplicaState.QUEUED, instance=None)
                | ~Q(state=ReplicaState.QUEUED),
                name="replica_queued_has_no_instance",
            ),
            models.CheckConstraint(
                condition=~Q(state__in=PLACED_REPLICA_STATES) | Q(instance__isnull=False),
                name="replica_placed_has_instance",
            ),
        ]

    def __str__(self) -> str:
        return f"replica {self.pk} of deployment {self.deployment_id} ({self.state})"

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_REPLICA_STATES
