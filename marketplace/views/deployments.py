"""Renter console: deployments (what to run and on which conditions; the reconciler places the
replicas as rentals). Every write goes through ``marketplace.deployments.services``, and the
figures shown are the API's (its serializers), so both doors say the same."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from marketplace.api.deployments import RENAMED, DeploymentSerializer, ReplicaSerializer
from marketplace.deployments.conditions import disk_that_fits, listed_gpu_models, matching_offers
from marketplace.deployments.services import (
    DeploymentSpec,
    deployment_create,
    deployment_stop,
    deployment_update,
    replica_stop,
)
from marketplace.forms.deployments import ConditionsForm, DeploymentForm, ScaleForm
from marketplace.models import Deployment, Role
from marketplace.models.deployments import (
    LIVE_REPLICA_STATES,
    DeploymentMode,
    DeploymentState,
    PlacementPolicy,
    ReplicaState,
)
from marketplace.tenancy import team_object_or_404, team_objects
from marketplace.views.console import error_text, require_role
from scheduler.models import LaunchMode


def _form_defaults() -> dict[str, str]:
    """What the create form shows before anything is typed: the spec's own defaults, under
    the API's field names, as the text a field holds."""
    api_names = {spec_name: api_name for api_name, spec_name in RENAMED.items()}
    defaults = {}
    for spec_field in fields(DeploymentSpec):
        value = spec_field.default
        if value is MISSING or value is None:
            continue
        text = value if isinstance(value, str) else f"{value:g}"
        defaults[api_names.get(spec_field.name, spec_field.name)] = text
    return defaults


FORM_DEFAULTS = _form_defaults()


def _refused(error: Exception) -> bool:
    """Whether ``error`` is the caller's to read (a refusal) rather than a bug."""
    return isinstance(error, ValidationError) or hasattr(error, "http_status")


def _list_page(request: HttpRequest, values, status: int = 200) -> HttpResponse:
    deployments = team_objects(request.team, Deployment.objects.all())
    context = {
        "deployments": DeploymentSerializer(deployments, many=True).data,
        "values": values,
        "gpu_models": listed_gpu_models(),
        "modes": DeploymentMode.choices,
        "launch_modes": LaunchMode.choices,
        "policies": PlacementPolicy.choices,
        "can_act": request.membership.allows(Role.MEMBER),
    }
    return render(request, "marketplace/deployments.html", context, status=status)


@login_required
def deployments(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        defaults = {**FORM_DEFAULTS, "disk_gb": str(disk_that_fits(int(FORM_DEFAULTS["disk_gb"])))}
        return _list_page(request, defaults)
    require_role(request, Role.MEMBER)
    try:
        deployment = deployment_create(team=request.team, spec=DeploymentForm(request.POST).spec())
    except Exception as error:
        if not _refused(error):
            raise
        messages.error(request, f"Could not create the deployment: {error_text(error)}")
        return _list_page(request, request.POST, status=400)  # the form as it was typed
    messages.success(
        request, f"Deployment {deployment.name} created. Its replicas update here by themselves."
    )
    return redirect("deployment-detail", pk=deployment.pk)


@login_required
def deployments_matching(request: HttpRequest) -> HttpResponse:
    """The create form's live count: how many machines meet the conditions typed so far (the
    reconciler's own filter over the offers read model), as a line of text for htmx."""
    form = ConditionsForm(request.GET)
    try:
        conditions = form.conditions()
    except ValidationError as error:
        return HttpResponse(f"Check the conditions: {error_text(error)}", content_type="text/plain")
    count = matching_offers(Deployment(**conditions)).count()
    text = f"{count} machine{'s' if count != 1 else ''} match{'es' if count == 1 else ''} now"
    return HttpResponse(text, content_type="text/plain")


def _replica_rows(deployment: Deployment) -> list[dict[str, object]]:
    """The API's replica figures, with the times as datetimes for the page's date format and,
    for a running replica, how long it has run."""
    replicas = list(
        deployment.replicas.select_related("instance__machine").order_by("created_at", "pk")
    )
    rows = []
    for replica, data in zip(replicas, ReplicaSerializer(replicas, many=True).data, strict=True):
        rows.append(
            {
                **data,
                "machine_name": replica.instance.machine.name if replica.instance else "",
                "started": replica.started_at,
                "ended": replica.ended_at,
                "is_live": replica.is_live,
                "running": replica.state == ReplicaState.RUNNING and replica.started_at,
            }
        )
    return rows


def _detail_context(request: HttpRequest, deployment: Deployment) -> dict[str, object]:
    replicas = _replica_rows(deployment)
    active = deployment.state == DeploymentState.ACTIVE
    return {
        "deployment": DeploymentSerializer(deployment).data,
        "replicas": replicas,
        "active": active,
        # Read again while anything may still change: settled, the page stops asking.
        "polling": active or any(r["is_live"] for r in replicas),
        "scalable": deployment.mode != DeploymentMode.CONTAINER,
        "can_act": request.membership.allows(Role.MEMBER),
        "live_states": LIVE_REPLICA_STATES,
    }


@login_required
def deployment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    deployment = team_object_or_404(request.team, Deployment.objects.all(), pk=pk)
    context = _detail_context(request, deployment)
    if request.headers.get("HX-Request"):  # the poll: the live part only
        return render(request, "marketplace/_deployment_replicas.html", context)
    return render(request, "marketplace/deployment_detail.html", context)


def _scale(request: HttpRequest, deployment: Deployment) -> None:
    changed = deployment_update(deployment=deployment, changes=ScaleForm(request.POST).changes())
    messages.success(request, f"Scaled to {changed.replica_count} replicas.")


def _stop(request: HttpRequest, deployment: Deployment) -> None:
    deployment_stop(deployment=deployment)
    messages.info(
        request,
        "Stopped: every replica's rental is destroyed (its data goes) and none is placed again.",
    )


# The deployment page's buttons, by the action in their URL.
DEPLOYMENT_ACTIONS: dict[str, Callable[[HttpRequest, Deployment], None]] = {
    "scale": _scale,
    "stop": _stop,
}


@login_required
@require_POST
def deployment_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    require_role(request, Role.MEMBER)
    handler = DEPLOYMENT_ACTIONS.get(action)
    if handler is None:
        raise Http404
    deployment = team_object_or_404(request.team, Deployment.objects.all(), pk=pk)
    try:
        handler(request, deployment)
    except Exception as error:
        if not _refused(error):
            raise
        messages.error(request, error_text(error))
    return redirect("deployment-detail", pk=deployment.pk)


@login_required
@require_POST
def deployment_replica_stop(request: HttpRequest, pk: int, replica_id: int) -> HttpResponse:
    require_role(request, Role.MEMBER)
    deployment = team_object_or_404(request.team, Deployment.objects.all(), pk=pk)
    replica = deployment.replicas.filter(pk=replica_id).first()
    if replica is None:
        raise Http404
    try:
        replica_stop(replica=replica)
    except Exception as error:
        if not _refused(error):
            raise
        messages.error(request, error_text(error))
    else:
        messages.info(request, f"Replica {replica.pk} stopped; its rental is destroyed.")
    return redirect("deployment-detail", pk=deployment.pk)


urlpatterns = [
    path("deployments/", deployments, name="deployments"),
    path("deployments/matching/", deployments_matching, name="deployments-matching"),
    path("deployments/<id:pk>/", deployment_detail, name="deployment-detail"),
    path(
        "deployments/<id:pk>/replicas/<id:replica_id>/stop/",
        deployment_replica_stop,
        name="deployment-replica-stop",
    ),
    path("deployments/<id:pk>/<str:action>/", deployment_action, name="deployment-action"),
]
