"""Clusters: a replica set deployment with one authenticated, load-balanced URL.

A cluster owns a deployment (mode ``replicaset``) and adds what a service needs: the
container port its URL forwards to, an end time, stop and resume, and optional autoscaling.
The deployment's reconciler keeps its replicas (places them as rentals with holds, replaces
dead ones, rolls spec changes); the gateway's routes follow its running replicas.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q


class ClusterState(models.TextChoices):
    RUNNING = "running", "Running"  # its deployment keeps `replicas` live
    STOPPED = "stopped", "Stopped"  # no replicas (nothing held); resume brings them back
    ENDED = "ended", "Ended"  # reached its end time; final


class Cluster(models.Model):
    team = models.ForeignKey("marketplace.Team", on_delete=models.CASCADE, related_name="clusters")
    deployment = models.OneToOneField(
        "marketplace.Deployment", on_delete=models.CASCADE, related_name="cluster"
    )
    state = models.CharField(
        max_length=16, choices=ClusterState.choices, default=ClusterState.RUNNING
    )
    # What the deployment runs while the cluster runs (it is 0 while stopped); the
    # autoscaler moves it between min_replicas and max_replicas when both are set.
    replicas = models.PositiveIntegerField(default=2)
    min_replicas = models.PositiveIntegerField(null=True, blank=True)
    max_replicas = models.PositiveIntegerField(null=True, blank=True)
    target_rps_per_replica = models.FloatField(
        null=True, blank=True, help_text="autoscaling: requests/s each replica should serve"
    )
    service_port = models.PositiveIntegerField(
        null=True, blank=True, help_text="the container port the URL forwards to; no URL when null"
    )
    ends_at = models.DateTimeField(help_text="the cluster ends here unless extended")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=ClusterState.values), name="cluster_state_known"
            ),
            models.CheckConstraint(
                condition=Q(service_port=None) | Q(service_port__gte=1, service_port__lte=65535),
                name="cluster_service_port_range",
            ),
            models.CheckConstraint(
                condition=Q(min_replicas=None, max_replicas=None)
                | Q(min_replicas__lte=F("max_replicas")),
                name="cluster_min_not_over_max",
            ),
        ]

    def __str__(self) -> str:
        return f"cluster {self.pk}"

    @property
    def autoscaled(self) -> bool:
        return self.min_replicas is not None and self.max_replicas is not None
