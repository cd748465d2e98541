"""vast.ai's serverless records, kept for the /api/v0/ facade: an endpoint (vast's
"endptjob") and its workergroup (vast's "autojob").

vast.ai makes a serverless service in two steps: an endpoint with autoscaling bounds, then a
workergroup naming a template and where its workers may run. Here the running thing is a
cluster (marketplace/clusters/): the workergroup makes it, from the template and the
endpoint's bounds, and these rows remember what the CLI said so that ``show endpoints`` and
``show workergroups`` print it back. The cluster is the team's own to watch and change in the
console and /api/v1/clusters/ as any other.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class EndpointState(models.TextChoices):
    ACTIVE = "active", "Active"  # its cluster runs (once a workergroup made one)
    STOPPED = "stopped", "Stopped"  # its cluster is stopped: no workers, nothing held


class ServerlessEndpoint(models.Model):
    team = models.ForeignKey(
        "marketplace.Team", on_delete=models.CASCADE, related_name="serverless_endpoints"
    )
    name = models.CharField(max_length=80)
    max_workers = models.PositiveIntegerField(help_text="the cluster's max_replicas")
    target_util = models.FloatField(help_text="fraction of a worker's requests/s aimed at")
    state = models.CharField(
        max_length=16, choices=EndpointState.choices, default=EndpointState.ACTIVE
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=EndpointState.values), name="serverless_endpoint_state"
            ),
        ]

    def __str__(self) -> str:
        return f"endpoint {self.pk} ({self.name})"


class Workergroup(models.Model):
    team = models.ForeignKey(
        "marketplace.Team", on_delete=models.CASCADE, related_name="workergroups"
    )
    # One workergroup per endpoint: a cluster runs one replica spec.
    endpoint = models.OneToOneField(
        ServerlessEndpoint, on_delete=models.CASCADE, related_name="workergroup"
    )
    cluster = models.OneToOneField(
        "marketplace.Cluster",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="workergroup",
    )
    template = models.ForeignKey(
        "marketplace.Template", on_delete=models.SET_NULL, null=True, related_name="+"
    )
    template_hash = models.CharField(max_length=32)
    search_params = models.CharField(max_length=2000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"workergroup {self.pk}"
