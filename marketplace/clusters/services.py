"""Writes on clusters: create, change, scale, open/close the endpoint, stop, resume, extend,
delete, and the end-of-time sweep.

A cluster is a replica set deployment plus what a service needs; each write here states
what the deployment should now be and lets ``deployment_update`` (in the same transaction)
do it: replicas are placed as rentals (a hold each: rate × GPUs × hours), extra ones end
(their rentals are destroyed and settle, releasing what they did not use), a changed image or
port rolls one replica at a time. The gateway's routes follow on commit (``routes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marketplace.clusters import routes
from marketplace.deployments.services import (
    MAX_REPLICAS,
    DeploymentSpec,
    deployment_create,
    deployment_delete,
    deployment_stop,
    deployment_update,
)
from marketplace.models import Cluster, Deployment, Team
from marketplace.models.clusters import ClusterState
from marketplace.models.deployments import PLACED_REPLICA_STATES
from marketplace.rentals.extending import rental_extend
from marketplace.rentals.renting import MAX_RENTAL_HOURS, MIN_RENTAL_HOURS

MIN_CLUSTER_REPLICAS = 2
MAX_TARGET_RPS = 1_000_000.0


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    image: str
    gpu_names: list[str] = field(default_factory=list)
    gpus_per_replica: int = 1
    replicas: int = 2
    entrypoint: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    disk_gb: int = 10
    duration_hours: float = 1.0
    service_port: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_rps_per_replica: float | None = None
    # Placement conditions beyond the GPU model, as a deployment's.
    max_price_per_gpu_hour: int | None = None
    regions: list[str] = field(default_factory=list)
    min_reliability: float = 0.0


# Changes that go to the deployment as they are (a changed image, command, env or disk rolls,
# one replica at a time). Not the GPUs: the deployment replaces replicas that no longer meet
# its conditions all at once, which would leave the URL without replicas meanwhile.
DEPLOYMENT_CHANGES = frozenset({"name", "image", "entrypoint", "args", "env", "disk_gb"})
AUTOSCALE_FIELDS = frozenset({"min_replicas", "max_replicas", "target_rps_per_replica"})


def _check_port(port: object, name: str = "service_port") -> None:
    if port is not None and (not isinstance(port, int) or not 1 <= port <= 65535):
        raise ValidationError({name: "A TCP port between 1 and 65535."})


def _check_autoscale(
    *, replicas: int, low: int | None, high: int | None, target: float | None
) -> None:
    given = [v is not None for v in (low, high, target)]
    if any(given) and not all(given):
        raise ValidationError(
            {
                "min_replicas": "Autoscaling needs min_replicas, max_replicas and "
                "target_rps_per_replica together (or none of them)."
            }
        )
    if not any(given):
        return
    errors = {}
    if not MIN_CLUSTER_REPLICAS <= low <= MAX_REPLICAS:
        errors["min_replicas"] = f"Between {MIN_CLUSTER_REPLICAS} and {MAX_REPLICAS}."
    if not low <= high <= MAX_REPLICAS:
        errors["max_replicas"] = f"Between min_replicas and {MAX_REPLICAS}."
    if not (math.isfinite(target) and 0 < target <= MAX_TARGET_RPS):
        errors["target_rps_per_replica"] = f"More than 0 and at most {MAX_TARGET_RPS:g}."
    if not errors and not low <= replicas <= high:
        errors["replicas"] = "Between min_replicas and max_replicas while autoscaling."
    if errors:
        raise ValidationError(errors)


def _check_replicas(replicas: object) -> None:
    if not isinstance(replicas, int) or not MIN_CLUSTER_REPLICAS <= replicas <= MAX_REPLICAS:
        raise ValidationError({"replicas": f"Between {MIN_CLUSTER_REPLICAS} and {MAX_REPLICAS}."})


def _hours_left(cluster: Cluster) -> float:
    """What a replica placed now should hold for: the time to the cluster's end (at least
    the shortest rental), so a replacement's rental never outlives the cluster by much."""
    left = (cluster.ends_at - timezone.now()).total_seconds() / 3600
    return min(max(left, MIN_RENTAL_HOURS), MAX_RENTAL_HOURS)


@transaction.atomic
def cluster_create(*, team: Team, spec: ClusterSpec) -> Cluster:
    _check_replicas(spec.replicas)
    _check_port(spec.service_port)
    _check_autoscale(
        replicas=spec.replicas,
        low=spec.min_replicas,
        high=spec.max_replicas,
        target=spec.target_rps_per_replica,
    )
    deployment = deployment_create(
        team=team,
        spec=DeploymentSpec(
            name=spec.name,
            image=spec.image,
            entrypoint=spec.entrypoint,
            args=list(spec.args),
            env=dict(spec.env),
            ports=[spec.service_port] if spec.service_port else [],
            disk_gb=spec.disk_gb,
            gpu_names=list(spec.gpu_names),
            gpus_per_replica=spec.gpus_per_replica,
            max_price_per_gpu_hour=spec.max_price_per_gpu_hour,
            regions=list(spec.regions),
            min_reliability=spec.min_reliability,
            replica_count=spec.replicas,
            duration_hours=spec.duration_hours,
        ),
    )
    cluster = Cluster.objects.create(
        team=team,
        deployment=deployment,
        replicas=spec.replicas,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        target_rps_per_replica=spec.target_rps_per_replica,
        service_port=spec.service_port,
        ends_at=timezone.now() + timedelta(hours=spec.duration_hours),
    )
    routes.routes_changed()
    return cluster


def _locked(cluster: Cluster) -> Cluster:
    return (
        Cluster.objects.select_for_update(of=("self",))
        .select_related("deployment", "team")
        .get(pk=cluster.pk)
    )


def _refuse_ended(cluster: Cluster) -> None:
    if cluster.state == ClusterState.ENDED:
        raise ValidationError({"state": "The cluster has ended; create another."})


def _deployment_to(cluster: Cluster, **changes: object) -> Deployment:
    """The deployment as the cluster now wants it; replicas for a running cluster only."""
    wanted = cluster.replicas if cluster.state == ClusterState.RUNNING else 0
    changes.setdefault("replica_count", wanted)
    changes.setdefault("duration_hours", _hours_left(cluster))
    return deployment_update(deployment=cluster.deployment, changes=changes)


@transaction.atomic
def cluster_update(*, cluster: Cluster, changes: dict[str, object]) -> Cluster:
    """Change what the replicas run (rolls, one replica at a time), or the autoscaling."""
    unknown = set(changes) - DEPLOYMENT_CHANGES - AUTOSCALE_FIELDS
    if unknown:
        raise ValidationError(dict.fromkeys(sorted(unknown), "This cannot be changed here."))
    cluster = _locked(cluster)
    _refuse_ended(cluster)
    scaling = {name: changes[name] for name in AUTOSCALE_FIELDS & set(changes)}
    if scaling:
        for name, value in scaling.items():
            setattr(cluster, name, value)
        if cluster.autoscaled and cluster.min_replicas is not None:
            cluster.replicas = min(
                max(cluster.replicas, cluster.min_replicas), cluster.max_replicas
            )
        _check_autoscale(
            replicas=cluster.replicas,
            low=cluster.min_replicas,
            high=cluster.max_replicas,
            target=cluster.target_rps_per_replica,
        )
        cluster.save()
    _deployment_to(cluster, **{k: v for k, v in changes.items() if k in DEPLOYMENT_CHANGES})
    routes.routes_changed()
    return cluster


@transaction.atomic
def cluster_scale(*, cluster: Cluster, replicas: int) -> Cluster:
    """Run ``replicas`` replicas: new ones are placed (each holds for the time left), extra
    ones end at once and their rentals settle (what they did not use is released)."""
    _check_replicas(replicas)
    cluster = _locked(cluster)
    _refuse_ended(cluster)
    if cluster.autoscaled and not cluster.min_replicas <= replicas <= cluster.max_replicas:
        raise ValidationError(
            {"replicas": f"Between {cluster.min_replicas} and {cluster.max_replicas} (autoscaled)."}
        )
    cluster.replicas = replicas
    cluster.save(update_fields=["replicas", "updated_at"])
    _deployment_to(cluster)
    return cluster


@transaction.atomic
def cluster_endpoint_set(*, cluster: Cluster, port: int) -> Cluster:
    """Open the URL on ``port`` (or move it there): the replicas are rolled to publish the
    new port one at a time, so the URL keeps answering; it stays the same."""
    _check_port(port, "port")
    if port is None:
        raise ValidationError({"port": "A TCP port between 1 and 65535."})
    cluster = _locked(cluster)
    _refuse_ended(cluster)
    cluster.service_port = port
    cluster.save(update_fields=["service_port", "updated_at"])
    _deployment_to(cluster, ports=[port])
    routes.routes_changed()
    return cluster


@transaction.atomic
def cluster_endpoint_close(*, cluster: Cluster) -> Cluster:
    cluster = _locked(cluster)
    _refuse_ended(cluster)
    cluster.service_port = None
    cluster.save(update_fields=["service_port", "updated_at"])
    _deployment_to(cluster, ports=[])
    routes.routes_changed()
    return cluster


@transaction.atomic
def cluster_stop(*, cluster: Cluster) -> Cluster:
    """Stop every replica (their rentals settle; nothing stays held). The URL and the
    settings stay for ``cluster_resume``."""
    cluster = _locked(cluster)
    _refuse_ended(cluster)
    cluster.state = ClusterState.STOPPED
    cluster.save(update_fields=["state", "updated_at"])
    _deployment_to(cluster)
    routes.routes_changed()
    return cluster


@transaction.atomic
def cluster_resume(*, cluster: Cluster) -> Cluster:
    cluster = _locked(cluster)
    _refuse_ended(cluster)
    if cluster.ends_at <= timezone.now():
        raise ValidationError({"state": "The cluster's time is over; extend it first."})
    cluster.state = ClusterState.RUNNING
    cluster.save(update_fields=["state", "updated_at"])
    _deployment_to(cluster)
    routes.routes_changed()
    return cluster


@transaction.atomic
def cluster_extend(*, cluster: Cluster, hours: float) -> Cluster:
    """Move the end by ``hours``; each running replica's rental (and its hold) is extended to
    the new end (402, nothing changed, when credit is short)."""
    if not (
        isinstance(hours, int | float)
        and math.isfinite(hours)
        and MIN_RENTAL_HOURS <= hours <= MAX_RENTAL_HOURS
    ):
        raise ValidationError({"hours": f"Between {MIN_RENTAL_HOURS} and {MAX_RENTAL_HOURS}."})
    cluster = _locked(cluster)
    _refuse_ended(cluster)
    cluster.ends_at += timedelta(hours=hours)
    cluster.save(update_fields=["ends_at", "updated_at"])
    replicas = cluster.deployment.replicas.filter(state__in=PLACED_REPLICA_STATES).select_related(
        "instance__rental"
    )
    for replica in replicas:
        rental = replica.instance.rental
        short = (cluster.ends_at - rental.ends_at).total_seconds() / 3600
        if short >= MIN_RENTAL_HOURS:
            rental_extend(rental=rental, hours=short)
    if cluster.state == ClusterState.RUNNING:
        _deployment_to(cluster)
    return cluster


@transaction.atomic
def cluster_delete(*, cluster: Cluster) -> None:
    """Stop it and forget it; its replicas' rentals stay (settled) in the team's ledger."""
    cluster = _locked(cluster)
    deployment_delete(deployment=cluster.deployment)  # the cluster goes with it
    routes.routes_changed()


def clusters_end_expired() -> int:
    """End the clusters whose time is over (the beat calls it); returns how many."""
    ended = 0
    due = Cluster.objects.filter(
        state__in=(ClusterState.RUNNING, ClusterState.STOPPED), ends_at__lte=timezone.now()
    ).values_list("pk", flat=True)
    for cluster_id in due:
        with transaction.atomic():
            cluster = _locked(Cluster(pk=cluster_id))
            if cluster.state == ClusterState.ENDED:
                continue
            cluster.state = ClusterState.ENDED
            cluster.save(update_fields=["state", "updated_at"])
            deployment_stop(deployment=cluster.deployment)
            routes.routes_changed()
            ended += 1
    return ended
