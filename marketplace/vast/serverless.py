"""vast.ai's serverless endpoints and workergroups, mapped onto clusters.

What maps to what (a vast.ai user's word → ours):

- **endpoint** (``create/show/update/delete endpoint``) → the autoscaling bounds of a cluster:
  ``--endpoint_name`` is the cluster's name, ``--max_workers`` its ``max_replicas``; a cluster
  keeps at least ``MIN_CLUSTER_REPLICAS`` (2) replicas, so that is the floor. Workers have no
  measured performance here, so ``--target_util`` scales on requests per second at the
  cluster's gateway: each worker is aimed at ``target_util × WORKER_REQUESTS_PER_SECOND``.
  ``--endpoint_state active|stopped`` resumes or stops the cluster.
- **workergroup** (``create/show/update/delete workergroup``) → the cluster itself, made from
  the endpoint's bounds and a template (image, command, env, disk; its one port is the
  cluster URL's port); ``--search_params`` become the replicas' placement conditions
  (``gpu_name``, ``num_gpus``, ``dph_per_gpu``, ``reliability``, ``geolocation``).
- **workers** (``get endpt-workers``) → the cluster's replicas; **logs** (``get endpt-logs``,
  ``get wrkgrp-logs``) → their containers' last lines; ``update workers`` → the template's
  current settings rolled onto the replicas, one at a time.

What does not translate is refused naming the CLI's flag: cold workers (``--cold_workers``,
``--cold_mult``, ``--min_cold_load`` other than the CLI's defaults: a worker here runs or does
not exist), ``--min_load``, the queue times, ``--inactivity_timeout``, ``--endpoint_state
suspended``, ``--launch_args``, ``--gpu_ram`` (name the GPU model instead), a second
workergroup on one endpoint (a cluster runs one replica spec), SSH or Jupyter templates.
Deleting a workergroup or its endpoint deletes the cluster: its workers stop and their rentals
settle (on vast.ai the instances stay; here nothing is left running unwatched).
"""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from rest_framework.exceptions import NotFound

from hosts.user_text import name_problem
from marketplace import offer_query
from marketplace.clusters.routes import gateway_url
from marketplace.clusters.services import (
    MIN_CLUSTER_REPLICAS,
    ClusterSpec,
    cluster_create,
    cluster_delete,
    cluster_endpoint_set,
    cluster_resume,
    cluster_stop,
    cluster_update,
)
from marketplace.deployments.services import MAX_REPLICAS
from marketplace.models import Cluster, ServerlessEndpoint, Team, Template, Workergroup
from marketplace.models.clusters import ClusterState
from marketplace.models.deployments import LIVE_REPLICA_STATES, ReplicaState
from marketplace.models.serverless import EndpointState
from marketplace.services.offers import short_gpu_name
from marketplace.tenancy import team_objects, team_or_public_objects
from marketplace.vast.errors import Refused
from scheduler.models import LaunchMode

# What one worker is taken to serve, in requests per second at the gateway: vast.ai measures
# each worker's performance, which a container here does not report.
WORKER_REQUESTS_PER_SECOND = 10.0
# How long each worker's rental holds credit for; the cluster ends then unless extended
# (the console's or /api/v1/clusters/<id>/extend/).
WORKER_HOURS = 24.0
# The CLI sends these on every ``create endpoint``; other values ask for cold workers.
COLD_DEFAULTS = {"min_cold_load": 0.0, "cold_mult": 2.5, "cold_workers": 5}
NOT_OFFERED = {
    "min_load": "workers have no measured performance here; the floor is "
    f"{MIN_CLUSTER_REPLICAS} workers",
    "max_queue_time": "requests are not queued per worker here",
    "target_queue_time": "requests are not queued per worker here",
    "inactivity_timeout": f"an endpoint keeps at least {MIN_CLUSTER_REPLICAS} workers",
}
# The filters the CLI adds to every ``--search_params`` (unless -n): all true of a new worker.
CLI_SEARCH_DEFAULTS = {"verified": True, "rentable": True, "rented": False}
PLACEMENT_FIELDS = "gpu_name, num_gpus, dph_per_gpu, reliability, geolocation"
# A cluster's placement conditions when a search names none of them.
UNCONDITIONED = {
    "gpu_names": [],
    "gpus_per_replica": 1,
    "max_price_per_gpu_hour": None,
    "regions": [],
    "min_reliability": 0.0,
}
ENDPOINT_STATES = {"active": EndpointState.ACTIVE, "stopped": EndpointState.STOPPED}


# --- reading the CLI's bodies ---------------------------------------------------------------


def _number(body: dict[str, Any], name: str, *, whole: bool = False) -> float | int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Refused(f"--{name} is a number.", field=name)
    if whole and value != int(value):
        raise Refused(f"--{name} is a whole number.", field=name)
    return int(value) if whole else float(value)


def _id(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise Refused(f"--{name} is an id, a whole number.", field=name)
    return value


def endpoint_settings(body: dict[str, Any], *, creating: bool) -> dict[str, Any]:
    """The CLI's endpoint body → {name, max_workers, target_util, state} (what is given)."""
    for name, why in NOT_OFFERED.items():
        value = _number(body, name)
        if value not in (None, 0.0):
            raise Refused(f"--{name} is not supported: {why}.", field=name)
    for name, default in COLD_DEFAULTS.items():
        value = _number(body, name, whole=name == "cold_workers")
        if value is not None and value != default:
            raise Refused(
                f"--{name} is not supported: there are no cold (stopped) workers here; an "
                f"endpoint runs between {MIN_CLUSTER_REPLICAS} and --max_workers workers.",
                field=name,
            )
    if body.get("autoscaler_instance") not in (None, "prod"):
        raise Refused("--auto_instance is not supported.", field="auto_instance")
    settings: dict[str, Any] = {}
    name = body.get("endpoint_name")
    if name is not None or creating:
        if (
            not isinstance(name, str)
            or (problem := name_problem(name.strip(), max_length=80)) is not None
        ):
            raise Refused(
                "--endpoint_name: " + (problem if isinstance(name, str) else "give a name."),
                field="endpoint_name",
            )
        settings["name"] = name.strip()
    workers = _number(body, "max_workers", whole=True)
    if workers is not None:
        if not MIN_CLUSTER_REPLICAS <= workers <= MAX_REPLICAS:
            raise Refused(
                f"--max_workers is between {MIN_CLUSTER_REPLICAS} and {MAX_REPLICAS}.",
                field="max_workers",
            )
        settings["max_workers"] = workers
    elif creating:
        raise Refused("--max_workers is required.", field="max_workers")
    util = _number(body, "target_util")
    if util is not None:
        if not 0 < util <= 1:
            raise Refused(
                "--target_util is a fraction, more than 0 and at most 1.", field="target_util"
            )
        settings["target_util"] = util
    elif creating:
        settings["target_util"] = 0.9
    state = body.get("endpoint_state")
    if state is not None:
        if state == "suspended":
            raise Refused(
                "--endpoint_state suspended is not supported: autoscaling is not paused "
                "apart from the workers; use active or stopped.",
                field="endpoint_state",
            )
        if state not in ENDPOINT_STATES:
            raise Refused("--endpoint_state is active or stopped.", field="endpoint_state")
        settings["state"] = ENDPOINT_STATES[state]
    return settings


def placement_conditions(search_params: Any) -> dict[str, Any]:
    """``--search_params`` (the offer query language) → a cluster's placement conditions."""
    if search_params in (None, ""):
        return {}
    if not isinstance(search_params, str):
        raise Refused("--search_params is one string of offer filters.", field="search_params")
    try:
        query = offer_query.parse(search_params)
    except offer_query.QueryError as error:
        raise Refused(f"--search_params: {error}.", field="search_params") from None
    if query.order:
        raise Refused(
            "--search_params: -o (an order) does not place workers.", field="search_params"
        )
    conditions: dict[str, Any] = {}
    for name, term in query.filters.items():
        if term is None:  # field=any: no condition
            continue
        op, value = term
        if name in CLI_SEARCH_DEFAULTS and op in ("=", "==") and value == CLI_SEARCH_DEFAULTS[name]:
            continue
        if name == "gpu_name" and op in ("=", "==", "in"):
            conditions["gpu_names"] = value if op == "in" else [value]
        elif name == "num_gpus" and op in ("=", "=="):
            conditions["gpus_per_replica"] = value
        elif name == "dph_per_gpu" and op in ("<", "<="):
            conditions["max_price_per_gpu_hour"] = value
        elif name == "reliability" and op in (">", ">="):
            conditions["min_reliability"] = value
        elif name == "geolocation" and op in ("=", "==", "in"):
            conditions["regions"] = value if op == "in" else [value]
        else:
            raise Refused(
                f"--search_params: '{name}{op}' does not place workers here; they are placed "
                f"by {PLACEMENT_FIELDS} (=, in, <= a price, >= a reliability).",
                field="search_params",
            )
    return conditions


def launch_settings(template: Template) -> dict[str, Any]:
    """What a worker runs, from the template: an args launch with at most one port (the one
    the cluster's URL forwards to)."""
    if template.launch_mode != LaunchMode.ENTRYPOINT:
        raise Refused(
            f"Template {template.hash_id} launches with {template.launch_mode}: workers run "
            "an args (entrypoint) launch here.",
            field="template_hash",
        )
    if len(template.ports) > 1:
        raise Refused(
            f"Template {template.hash_id} opens {len(template.ports)} ports: a worker serves "
            "one, the port its endpoint's URL forwards to.",
            field="template_hash",
        )
    return {
        "image": template.image,
        "entrypoint": template.entrypoint,
        "args": list(template.args),
        "env": dict(template.env),
        "disk_gb": template.disk_gb,
        "service_port": template.ports[0] if template.ports else None,
    }


def workergroup_template(team: Team, body: dict[str, Any], *, required: bool) -> Template | None:
    """The template ``--template_hash`` (or ``--template_id``) names: the team's or public."""
    hash_id, number = body.get("template_hash"), _id(body, "template_id")
    found = team_or_public_objects(team, Template.objects.all())
    if isinstance(hash_id, str) and hash_id:
        template = found.filter(hash_id=hash_id[:64]).first()
        named = hash_id[:40]
    elif hash_id is not None:
        raise Refused("--template_hash is a template's hash_id.", field="template_hash")
    elif number is not None:
        template, named = found.filter(pk=number).first(), str(number)
    elif required:
        raise Refused("--template_hash is required.", field="template_hash")
    else:
        return None
    if template is None:
        raise NotFound(f"There is no template {named} of yours or public.")
    return template


def _refuse_unsupported_workergroup(body: dict[str, Any]) -> None:
    if body.get("launch_args") not in (None, ""):
        raise Refused(
            "--launch_args is not supported: workers run what their template says; update "
            "the template (vastai update template) and then the workers.",
            field="launch_args",
        )
    if body.get("gpu_ram") is not None:
        raise Refused(
            "--gpu_ram is not supported: name the GPU models in --search_params "
            "(gpu_name=RTX_4090 or gpu_name in [A100,H100]).",
            field="gpu_ram",
        )
    if body.get("autoscaler_instance") not in (None, "prod"):
        raise Refused("--auto_instance is not supported.", field="auto_instance")


# --- finding the team's records --------------------------------------------------------------


def team_endpoints(team: Team) -> QuerySet[ServerlessEndpoint]:
    return team_objects(team, ServerlessEndpoint.objects.all()).select_related(
        "workergroup__cluster__deployment", "workergroup__template"
    )


def team_endpoint(team: Team, pk: Any) -> ServerlessEndpoint:
    if isinstance(pk, bool) or not isinstance(pk, int) or not 0 < pk < 2**63:
        raise Refused("id is an endpoint's id, a whole number.", field="id")
    found = team_endpoints(team).filter(pk=pk).first()
    if found is None:
        raise NotFound(f"Endpoint {pk} is not one of your team's endpoints.")
    return found


def team_workergroups(team: Team) -> QuerySet[Workergroup]:
    return team_objects(team, Workergroup.objects.all()).select_related(
        "endpoint", "cluster__deployment", "template"
    )


def team_workergroup(team: Team, pk: Any) -> Workergroup:
    if isinstance(pk, bool) or not isinstance(pk, int) or not 0 < pk < 2**63:
        raise Refused("id is a workergroup's id, a whole number.", field="id")
    found = team_workergroups(team).filter(pk=pk).first()
    if found is None:
        raise NotFound(f"Workergroup {pk} is not one of your team's workergroups.")
    return found


def _named_endpoint(team: Team, body: dict[str, Any]) -> ServerlessEndpoint:
    number, name = _id(body, "endpoint_id"), body.get("endpoint_name")
    if number is not None:
        return team_endpoint(team, number)
    if isinstance(name, str) and name.strip():
        named = list(team_endpoints(team).filter(name=name.strip())[:2])
        if len(named) == 1:
            return named[0]
        if named:
            raise Refused(
                f"Several endpoints are named {name.strip()[:80]}; give --endpoint_id.",
                field="endpoint_name",
            )
        raise NotFound(f"No endpoint of your team is named {name.strip()[:80]}.")
    raise Refused("Name the endpoint with --endpoint_id or --endpoint_name.", field="endpoint_id")


# --- writes ---------------------------------------------------------------------------------


def _as_validation(error: ValidationError) -> Refused:
    fields = error.message_dict if hasattr(error, "error_dict") else {"": error.messages}
    name, messages = next(iter(fields.items()))
    return Refused(f"{name}: {' '.join(messages)}" if name else " ".join(messages), field=name)


def _autoscaling(endpoint: ServerlessEndpoint) -> dict[str, Any]:
    return {
        "min_replicas": MIN_CLUSTER_REPLICAS,
        "max_replicas": endpoint.max_workers,
        "target_rps_per_replica": endpoint.target_util * WORKER_REQUESTS_PER_SECOND,
    }


@transaction.atomic
def endpoint_create(*, team: Team, body: dict[str, Any]) -> ServerlessEndpoint:
    settings = endpoint_settings(body, creating=True)
    settings.pop("state", None)
    return ServerlessEndpoint.objects.create(team=team, **settings)


@transaction.atomic
def endpoint_update(*, endpoint: ServerlessEndpoint, body: dict[str, Any]) -> ServerlessEndpoint:
    """The endpoint's settings, and its cluster's bounds, name and state with them."""
    settings = endpoint_settings(body, creating=False)
    endpoint = ServerlessEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    for name, value in settings.items():
        setattr(endpoint, name, value)
    endpoint.save()
    cluster = _cluster_of(endpoint)
    if cluster is not None:
        try:
            if cluster.state == ClusterState.RUNNING and endpoint.state == EndpointState.STOPPED:
                cluster = cluster_stop(cluster=cluster)
            changes = {**_autoscaling(endpoint), "name": endpoint.name}
            cluster = cluster_update(cluster=cluster, changes=changes)
            if cluster.state == ClusterState.STOPPED and endpoint.state == EndpointState.ACTIVE:
                cluster_resume(cluster=cluster)
        except ValidationError as error:
            raise _as_validation(error) from None
    return endpoint


def _cluster_of(endpoint: ServerlessEndpoint) -> Cluster | None:
    workergroup = Workergroup.objects.filter(endpoint=endpoint).select_related("cluster").first()
    return workergroup.cluster if workergroup is not None else None


@transaction.atomic
def endpoint_delete(*, endpoint: ServerlessEndpoint) -> None:
    """Its cluster goes with it (workers stop, their rentals settle)."""
    cluster = _cluster_of(endpoint)
    if cluster is not None:
        cluster_delete(cluster=cluster)
    ServerlessEndpoint.objects.filter(pk=endpoint.pk).delete()


@transaction.atomic
def workergroup_create(*, team: Team, body: dict[str, Any]) -> Workergroup:
    """The endpoint's cluster, from the template and the placement conditions; its workers
    are placed in this transaction (each a rental with its hold) or queued, saying why."""
    _refuse_unsupported_workergroup(body)
    endpoint = _named_endpoint(team, body)
    endpoint = ServerlessEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    if Workergroup.objects.filter(endpoint=endpoint).exists():
        raise Refused(
            f"Endpoint {endpoint.pk} has its workergroup already: an endpoint here runs one "
            "(one cluster, one replica spec). Update it, or create another endpoint.",
            field="endpoint_id",
        )
    template = workergroup_template(team, body, required=True)
    conditions = placement_conditions(body.get("search_params"))
    spec = ClusterSpec(
        name=endpoint.name,
        replicas=MIN_CLUSTER_REPLICAS,
        duration_hours=WORKER_HOURS,
        **launch_settings(template),
        **conditions,
        **_autoscaling(endpoint),
    )
    try:
        cluster = cluster_create(team=team, spec=spec)
        if endpoint.state == EndpointState.STOPPED:
            cluster = cluster_stop(cluster=cluster)
    except ValidationError as error:
        raise _as_validation(error) from None
    return Workergroup.objects.create(
        team=team,
        endpoint=endpoint,
        cluster=cluster,
        template=template,
        template_hash=template.hash_id,
        search_params=(body.get("search_params") or "")[:2000],
    )


@transaction.atomic
def workergroup_update(*, workergroup: Workergroup, body: dict[str, Any]) -> Workergroup:
    """A new template or new placement conditions; the workers roll onto them one at a time."""
    _refuse_unsupported_workergroup(body)
    workergroup = Workergroup.objects.select_for_update().get(pk=workergroup.pk)
    moved = _id(body, "endpoint_id")
    if moved is not None and moved != workergroup.endpoint_id:
        raise Refused("--endpoint_id: a workergroup stays on its endpoint.", field="endpoint_id")
    changes: dict[str, Any] = {}
    template = workergroup_template(workergroup.team, body, required=False)
    if template is not None:
        workergroup.template, workergroup.template_hash = template, template.hash_id
    params = body.get("search_params")
    conditions = placement_conditions(params)
    # The CLI sends its default filters when --search_params is left out: only a search
    # that names a condition replaces the workergroup's, all of them.
    if conditions:
        workergroup.search_params = params[:2000]
        changes.update({**UNCONDITIONED, **conditions})
    workergroup.save()
    if workergroup.cluster is not None:
        if template is not None:
            _roll_template(workergroup.cluster, template)
        if changes:
            _replace_conditions(workergroup.cluster, changes)
    return workergroup


def _replace_conditions(cluster: Cluster, conditions: dict[str, Any]) -> None:
    """New conditions go to the deployment: replicas that no longer meet them are replaced."""
    from marketplace.deployments.services import deployment_update

    try:
        deployment_update(deployment=cluster.deployment, changes=conditions)
    except ValidationError as error:
        raise _as_validation(error) from None


def _roll_template(cluster: Cluster, template: Template) -> bool:
    """The cluster made to run the template's settings (rolls if any changed); whether any did."""
    wanted = launch_settings(template)
    port = wanted.pop("service_port")
    deployment = cluster.deployment
    changed = {k: v for k, v in wanted.items() if getattr(deployment, k) != v}
    try:
        if changed:
            cluster_update(cluster=cluster, changes=changed)
        if port is not None and port != cluster.service_port:
            cluster_endpoint_set(cluster=cluster, port=port)
            changed["service_port"] = port
    except ValidationError as error:
        raise _as_validation(error) from None
    return bool(changed)


@transaction.atomic
def workers_update(*, workergroup: Workergroup) -> int:
    """``update workers``: the template's current settings rolled onto the workers; how many
    workers will be replaced (0 when they already run them)."""
    workergroup = Workergroup.objects.select_related("cluster__deployment", "template").get(
        pk=workergroup.pk
    )
    if workergroup.cluster is None:
        return 0
    if workergroup.template is None:
        raise Refused(
            f"Workergroup {workergroup.pk}'s template was deleted; give it another "
            "(vastai update workergroup --template_hash).",
            field="workergroup_id",
        )
    if not _roll_template(workergroup.cluster, workergroup.template):
        return 0
    return workergroup.cluster.deployment.replicas.filter(state__in=LIVE_REPLICA_STATES).count()


@transaction.atomic
def workergroup_delete(*, workergroup: Workergroup) -> None:
    """Its cluster goes with it (workers stop, their rentals settle); the endpoint stays."""
    if workergroup.cluster is not None:
        cluster_delete(cluster=workergroup.cluster)
    Workergroup.objects.filter(pk=workergroup.pk).delete()


# --- what the CLI prints ---------------------------------------------------------------------


def endpoint_row(endpoint: ServerlessEndpoint) -> dict[str, Any]:
    workergroup = getattr(endpoint, "workergroup", None)
    cluster = workergroup.cluster if workergroup is not None else None
    return {
        "id": endpoint.pk,
        "endpoint_name": endpoint.name,
        "endpoint_state": endpoint.state,
        "max_workers": endpoint.max_workers,
        "target_util": endpoint.target_util,
        "min_load": 0.0,
        "min_cold_load": 0.0,
        "cold_workers": 0,
        "cold_mult": COLD_DEFAULTS["cold_mult"],
        "user_id": endpoint.team_id,
        "created_at": endpoint.created_at.timestamp(),
        "workergroup_id": workergroup.pk if workergroup is not None else None,
        "cluster_id": cluster.pk if cluster is not None else None,
        "url": gateway_url(cluster.pk) if cluster is not None and cluster.service_port else None,
    }


def workergroup_row(workergroup: Workergroup) -> dict[str, Any]:
    cluster = workergroup.cluster
    deployment = cluster.deployment if cluster is not None else None
    return {
        "id": workergroup.pk,
        "endpoint_id": workergroup.endpoint_id,
        "endpoint_name": workergroup.endpoint.name,
        "template_hash": workergroup.template_hash,
        "template_id": workergroup.template_id,
        "search_params": workergroup.search_params,
        "gpu_ram": None,
        "launch_args": None,
        "min_load": 0.0,
        "target_util": workergroup.endpoint.target_util,
        "max_workers": workergroup.endpoint.max_workers,
        "user_id": workergroup.team_id,
        "created_at": workergroup.created_at.timestamp(),
        "cluster_id": cluster.pk if cluster is not None else None,
        "cluster_state": cluster.state if cluster is not None else None,
        "workers": cluster.replicas if cluster is not None else 0,
        "queue_reason": deployment.queue_reason if deployment is not None else "",
    }


# vast.ai's worker statuses, by our replica's state.
WORKER_STATUS = {
    ReplicaState.QUEUED: "queued",
    ReplicaState.PLACED: "loading",
    ReplicaState.RUNNING: "running",
    ReplicaState.SUCCEEDED: "exited",
    ReplicaState.FAILED: "error",
    ReplicaState.STOPPED: "stopped",
    ReplicaState.LOST: "error",
}


def cluster_workers(cluster: Cluster | None) -> list[dict[str, Any]]:
    """The cluster's live replicas as ``get endpt-workers`` prints them (``id`` is the
    worker's instance id, for ``vastai logs`` and the like; null while queued)."""
    if cluster is None:
        return []
    replicas = (
        cluster.deployment.replicas.filter(state__in=LIVE_REPLICA_STATES)
        .select_related("instance__machine")
        .prefetch_related("instance__gpu_allocations__gpu")
        .order_by("pk")
    )
    return [worker_row(replica) for replica in replicas]


def worker_row(replica) -> dict[str, Any]:
    instance = replica.instance
    gpus = _gpu_names(instance) if instance is not None else []
    return {
        "id": instance.pk if instance is not None else None,
        "replica_id": replica.pk,
        "status": WORKER_STATUS.get(replica.state, replica.state),
        "instance_state": instance.state if instance is not None else None,
        "machine_id": instance.machine_id if instance is not None else None,
        "gpu_name": gpus[0] if gpus else None,
        "num_gpus": len(gpus),
        "measured_perf": None,
        "reason": replica.reason or None,
    }


def _gpu_names(instance) -> list[str]:
    """As offers name them ("RTX 4090", not "NVIDIA GeForce RTX 4090")."""
    return [short_gpu_name(allocation.gpu.name) for allocation in instance.gpu_allocations.all()]
