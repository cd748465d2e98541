"""Writes on deployments: create, change, stop, delete, stop one replica.

Each checks what it is given whoever calls (API, console, a script), so a bad spec is refused
with an error naming the field before anything is written, and then runs a reconcile pass in
the same transaction, so the answer already shows the replicas placed, queued or stopped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace

from django.core.exceptions import ValidationError
from django.db import transaction

from hosts.user_text import name_problem
from marketplace.deployments.reconciler import reconcile_locked, replica_end
from marketplace.models import Deployment, Replica, Team
from marketplace.models.deployments import (
    DeploymentMode,
    DeploymentState,
    PlacementPolicy,
    ReplicaState,
)
from marketplace.rentals.renting import MAX_RENTAL_HOURS, MIN_RENTAL_HOURS
from marketplace.validation import validate_launch
from scheduler.models import LaunchMode
from scheduler.placement import BINPACK, CARD_POLICIES

MAX_REPLICAS = 256
MAX_GPUS_PER_REPLICA = 64
MAX_DISK_GB = 100_000
MAX_LIST = 32


@dataclass(frozen=True)
class DeploymentSpec:
    """What a deployment runs and where: the fields a team sets (money in micro-dollars)."""

    name: str
    image: str
    mode: str = DeploymentMode.REPLICASET
    launch_mode: str = LaunchMode.ENTRYPOINT
    entrypoint: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    disk_gb: int = 50
    gpu_names: list[str] = field(default_factory=list)
    gpus_per_replica: int = 1
    max_price_per_gpu_hour: int | None = None
    regions: list[str] = field(default_factory=list)
    min_reliability: float = 0.0
    policy: str = PlacementPolicy.SPREAD
    replica_count: int = 1
    completions: int = 1
    backoff_limit: int = 6
    duration_hours: float = 1.0
    budget: int | None = None
    # A slice of one card per replica (API: gpu_share), and which card it goes on.
    slice_core_percent: int | None = None
    slice_memory_mb: int | None = None
    card_policy: str = BINPACK


SPEC_FIELDS = tuple(f.name for f in fields(DeploymentSpec))
# What a change may touch: the count, the conditions, the spec, the policy. The mode is what
# the deployment is; another mode is another deployment.
CHANGEABLE = frozenset(SPEC_FIELDS) - {"mode"}


def deployment_validate(spec: DeploymentSpec) -> DeploymentSpec:
    """The spec as it will be stored (a container is a job of one), or ValidationError naming
    every bad field."""
    errors: dict[str, str] = {}
    if (problem := name_problem(spec.name.strip(), max_length=80)) is not None:
        errors["name"] = problem
    if spec.mode not in DeploymentMode.values:
        errors["mode"] = f"Choose one of {', '.join(DeploymentMode.values)}."
    if spec.policy not in PlacementPolicy.values:
        errors["policy"] = f"Choose one of {', '.join(PlacementPolicy.values)}."
    if spec.launch_mode not in LaunchMode.values:
        errors["launch_mode"] = f"Choose one of {', '.join(LaunchMode.values)}."
    try:
        validate_launch(
            image=spec.image,
            env=spec.env,
            ports=spec.ports,
            entrypoint=spec.entrypoint,
            args=spec.args,
        )
    except ValidationError as error:
        errors.update({name: " ".join(messages) for name, messages in error.message_dict.items()})
    if not 1 <= spec.gpus_per_replica <= MAX_GPUS_PER_REPLICA:
        errors["gpus_per_replica"] = f"Between 1 and {MAX_GPUS_PER_REPLICA}."
    least = 0 if spec.mode == DeploymentMode.REPLICASET else 1
    if not least <= spec.replica_count <= MAX_REPLICAS:
        errors["replicas"] = f"Between {least} and {MAX_REPLICAS}."
    if not 1 <= spec.completions <= 100_000:
        errors["completions"] = "Between 1 and 100000."
    if not 0 <= spec.backoff_limit <= 1000:
        errors["backoff_limit"] = "Between 0 and 1000."
    if not (
        math.isfinite(spec.duration_hours)
        and MIN_RENTAL_HOURS <= spec.duration_hours <= MAX_RENTAL_HOURS
    ):
        errors["duration_hours"] = f"Between {MIN_RENTAL_HOURS} and {MAX_RENTAL_HOURS} hours."
    if not 1 <= spec.disk_gb <= MAX_DISK_GB:
        errors["disk_gb"] = f"Between 1 and {MAX_DISK_GB} GB."
    if not (math.isfinite(spec.min_reliability) and 0 <= spec.min_reliability <= 1):
        errors["min_reliability"] = "Between 0 and 1."
    if spec.max_price_per_gpu_hour is not None and spec.max_price_per_gpu_hour < 0:
        errors["max_price_per_gpu_hour"] = "Must not be negative."
    if spec.budget is not None and spec.budget < 0:
        errors["budget_usd"] = "Must not be negative."
    errors.update(_slice_errors(spec))
    for name, values, longest in (
        ("gpu_names", spec.gpu_names, 120),
        ("regions", spec.regions, 64),
    ):
        if len(values) > MAX_LIST or not all(
            isinstance(v, str) and v.strip() and len(v) <= longest for v in values
        ):
            errors[name] = f"At most {MAX_LIST} names of 1 to {longest} characters."
    if errors:
        raise ValidationError(errors)
    if spec.mode == DeploymentMode.CONTAINER:
        spec = replace(spec, replica_count=1, completions=1)
    return replace(
        spec,
        name=spec.name.strip(),
        gpu_names=[v.strip() for v in spec.gpu_names],
        regions=[v.strip() for v in spec.regions],
    )


def _slice_errors(spec: DeploymentSpec) -> dict[str, str]:
    """A slice per replica is one card's share: sizes in range, one GPU, a known card policy."""
    errors = {}
    if spec.card_policy not in CARD_POLICIES:
        errors["card_policy"] = f"Choose one of {', '.join(CARD_POLICIES)}."
    if spec.slice_core_percent is None and spec.slice_memory_mb is None:
        return errors
    if not (
        isinstance(spec.slice_core_percent, int)
        and isinstance(spec.slice_memory_mb, int)
        and 1 <= spec.slice_core_percent <= 100
        and spec.slice_memory_mb >= 1
    ):
        errors["gpu_share"] = "Give core_percent from 1 to 100 and memory_mb of at least 1."
    elif spec.gpus_per_replica != 1:
        errors["gpus_per_replica"] = "A replica with a GPU slice takes part of one GPU: use 1."
    return errors


def spec_of(deployment: Deployment) -> DeploymentSpec:
    return DeploymentSpec(**{name: getattr(deployment, name) for name in SPEC_FIELDS})


@transaction.atomic
def deployment_create(*, team: Team, spec: DeploymentSpec) -> Deployment:
    spec = deployment_validate(spec)
    deployment = Deployment.objects.create(team=team, **asdict(spec))
    # Locked by its creation until commit; the first pass queues and places its replicas.
    reconcile_locked(deployment)
    return deployment


@transaction.atomic
def deployment_update(*, deployment: Deployment, changes: Mapping[str, object]) -> Deployment:
    """Change the count, conditions, spec or policy. More replicas start and extra ones stop
    at once; replicas that no longer meet the conditions or the spec are replaced."""
    unknown = set(changes) - CHANGEABLE
    if unknown:
        raise ValidationError(dict.fromkeys(sorted(unknown), "This cannot be changed."))
    deployment = _locked(deployment.pk)
    if deployment.state != DeploymentState.ACTIVE:
        raise ValidationError({"state": f"The deployment is {deployment.state}; create another."})
    spec = deployment_validate(replace(spec_of(deployment), **changes))
    for name, value in asdict(spec).items():
        setattr(deployment, name, value)
    deployment.save()
    reconcile_locked(deployment)
    return deployment


@transaction.atomic
def deployment_stop(*, deployment: Deployment) -> Deployment:
    """Stop: every replica ends (its rental is destroyed, its data goes) and none is placed
    again. A deployment that already ended stays as it is."""
    deployment = _locked(deployment.pk)
    if deployment.state == DeploymentState.ACTIVE:
        deployment.state = DeploymentState.STOPPED
        deployment.save(update_fields=["state", "updated_at"])
    reconcile_locked(deployment)
    return deployment


@transaction.atomic
def deployment_delete(*, deployment: Deployment) -> None:
    """Stop it, then forget it. Its replicas' rentals stay (destroyed, settled) in the team's
    rentals and ledger."""
    deployment_stop(deployment=deployment).delete()


@transaction.atomic
def replica_stop(*, replica: Replica) -> Replica:
    """Stop one replica: its rental is destroyed. A replica set places a replacement; a job
    runs another in its place until its completions."""
    deployment = _locked(replica.deployment_id)
    replica = Replica.objects.select_related("instance").get(pk=replica.pk)
    replica_end(replica, ReplicaState.STOPPED, "Stopped by the team")
    reconcile_locked(deployment)
    replica.refresh_from_db()
    return replica


def _locked(deployment_id: int) -> Deployment:
    return (
        Deployment.objects.select_for_update(of=("self",))
        .select_related("team")
        .get(pk=deployment_id)
    )
