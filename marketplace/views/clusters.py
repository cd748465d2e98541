"""Renter console: clusters (N replicas behind one URL). Create shows the per-GPU rate and
the total hold before it confirms; the detail page shows the URL, the replicas and their live
state. Writes go through ``marketplace.clusters.services``; figures are the API's."""

from __future__ import annotations

import shlex
from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from billing.usd import format_amount, format_usd
from marketplace.api.clusters import ClusterSerializer
from marketplace.clusters.pricing import cluster_quote
from marketplace.clusters.services import (
    cluster_create,
    cluster_endpoint_close,
    cluster_endpoint_set,
    cluster_extend,
    cluster_resume,
    cluster_scale,
    cluster_stop,
    cluster_update,
)
from marketplace.deployments.conditions import disk_that_fits, listed_gpu_models, spec_hash
from marketplace.forms.base import whole_number
from marketplace.forms.clusters import ClusterForm, ClusterUpdateForm
from marketplace.models import Cluster, Role
from marketplace.models.clusters import ClusterState
from marketplace.models.deployments import ReplicaState
from marketplace.tenancy import team_object_or_404, team_objects
from marketplace.views.console import error_text, require_role
from marketplace.views.deployments import _refused, _replica_rows

DEFAULTS = {"replicas": "2", "gpus_per_replica": "1", "duration_hours": "1"}
DEFAULTS_DISK_GB = 10  # or less, when no listed machine gives a replica that much


def _clusters(request: HttpRequest):
    return team_objects(request.team, Cluster.objects.select_related("deployment"))


def _list_page(request: HttpRequest, values, *, quote=None, status: int = 200) -> HttpResponse:
    clusters = list(_clusters(request))
    rows = ClusterSerializer(clusters, many=True).data
    context = {
        # The API's figures, with the end as a datetime for the page's date format.
        "clusters": [{**row, "ends": c.ends_at} for row, c in zip(rows, clusters, strict=True)],
        "values": values,
        "gpu_models": listed_gpu_models(),
        "quote": quote,
        "can_act": request.membership.allows(Role.MEMBER),
    }
    return render(request, "marketplace/clusters.html", context, status=status)


@login_required
def clusters(request: HttpRequest) -> HttpResponse:
    """GET lists; POST without ``confirm`` shows what it would hold; with it, creates."""
    if request.method != "POST":
        return _list_page(request, {**DEFAULTS, "disk_gb": str(disk_that_fits(DEFAULTS_DISK_GB))})
    require_role(request, Role.MEMBER)
    try:
        spec = ClusterForm(request.POST).spec()
        if request.POST.get("confirm") != "1":
            quote = cluster_quote(
                gpu_names=spec.gpu_names,
                gpus_per_replica=spec.gpus_per_replica,
                replicas=spec.replicas,
                disk_gb=spec.disk_gb,
                hours=spec.duration_hours,
            )
            shown = {
                "rate": format_usd(quote.price_per_gpu_hour) if quote.price_per_gpu_hour else None,
                "hold": format_amount(quote.hold),
                "placeable": quote.placeable,
                "replicas": spec.replicas,
                "gpus": spec.gpus_per_replica,
                "hours": f"{spec.duration_hours:g}",
            }
            return _list_page(request, request.POST, quote=shown)
        cluster = cluster_create(team=request.team, spec=spec)
    except Exception as error:
        if not _refused(error):
            raise
        messages.error(request, f"Could not create the cluster: {error_text(error)}")
        return _list_page(request, request.POST, status=400)
    messages.success(
        request, f"Cluster {spec.name} created. Its replicas update here by themselves."
    )
    return redirect("cluster-detail", pk=cluster.pk)


def _roll_progress(cluster: Cluster) -> tuple[int, int] | None:
    """(replicas running what the cluster now asks for, replicas live) while a change rolls
    out; None when every live replica runs it."""
    live = [r for r in cluster.deployment.replicas.all() if r.is_live]
    wanted = spec_hash(cluster.deployment)
    if all(r.spec_hash in ("", wanted) for r in live):  # "": queued, placed as asked now
        return None
    current = sum(r.spec_hash == wanted and r.state == ReplicaState.RUNNING for r in live)
    return current, cluster.replicas


def _detail_context(request: HttpRequest, cluster: Cluster) -> dict[str, object]:
    replicas = _replica_rows(cluster.deployment)
    return {
        "roll": _roll_progress(cluster),
        "args_text": shlex.join(cluster.deployment.args),
        "env_text": "\n".join(f"{k}={v}" for k, v in cluster.deployment.env.items()),
        "cluster": ClusterSerializer(cluster).data,
        "ends": cluster.ends_at,
        "replicas": replicas,
        "live": cluster.state != ClusterState.ENDED,
        "polling": cluster.state != ClusterState.ENDED or any(r["is_live"] for r in replicas),
        "can_act": request.membership.allows(Role.MEMBER),
    }


@login_required
def cluster_detail(request: HttpRequest, pk: int) -> HttpResponse:
    cluster = team_object_or_404(request.team, Cluster.objects.select_related("deployment"), pk=pk)
    context = _detail_context(request, cluster)
    if request.headers.get("HX-Request"):  # the poll: the live part only
        return render(request, "marketplace/_cluster_live.html", context)
    return render(request, "marketplace/cluster_detail.html", context)


def _number(request: HttpRequest, name: str) -> int:
    from django.core.exceptions import ValidationError

    try:
        return whole_number(request.POST.get(name))
    except ValueError as error:
        raise ValidationError({name: str(error)}) from None


def _scale(request, cluster):
    changed = cluster_scale(cluster=cluster, replicas=_number(request, "replicas"))
    messages.success(request, f"Scaled to {changed.replicas} replicas.")


def _endpoint(request, cluster):
    port = _number(request, "port")
    cluster_endpoint_set(cluster=cluster, port=port)
    messages.success(request, f"The URL forwards to port {port}; it stays the same.")


def _endpoint_close(request, cluster):
    cluster_endpoint_close(cluster=cluster)
    messages.info(request, "The URL is closed.")


def _update(request, cluster):
    """What the replicas run (image, entrypoint, arguments, environment): rolled out one
    replica at a time, as the API's PATCH does."""
    asked = ClusterUpdateForm(request.POST).changes()
    changes = {k: v for k, v in asked.items() if getattr(cluster.deployment, k) != v}
    if not changes:
        messages.info(request, "Nothing changed: the replicas keep running what they run.")
        return
    cluster_update(cluster=cluster, changes=changes)
    messages.success(
        request, "Rolling out: one replica at a time is replaced; the URL keeps answering."
    )


def _stop(request, cluster):
    cluster_stop(cluster=cluster)
    messages.info(request, "Stopped: every replica's rental settled. Resume keeps the same URL.")


def _resume(request, cluster):
    cluster_resume(cluster=cluster)
    messages.success(request, "Resumed: replicas are being placed.")


def _extend(request, cluster):
    cluster_extend(cluster=cluster, hours=_number(request, "hours"))
    messages.success(request, "Extended; every running replica's hold follows.")


CLUSTER_ACTIONS: dict[str, Callable[[HttpRequest, Cluster], None]] = {
    "scale": _scale,
    "endpoint": _endpoint,
    "endpoint-close": _endpoint_close,
    "stop": _stop,
    "update": _update,
    "resume": _resume,
    "extend": _extend,
}


@login_required
@require_POST
def cluster_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    require_role(request, Role.MEMBER)
    handler = CLUSTER_ACTIONS.get(action)
    if handler is None:
        raise Http404
    cluster = team_object_or_404(request.team, Cluster.objects.select_related("deployment"), pk=pk)
    try:
        handler(request, cluster)
    except Exception as error:
        if not _refused(error):
            raise
        messages.error(request, error_text(error))
    return redirect("cluster-detail", pk=cluster.pk)


urlpatterns = [
    path("clusters/", clusters, name="clusters"),
    path("clusters/<id:pk>/", cluster_detail, name="cluster-detail"),
    path("clusters/<id:pk>/<str:action>/", cluster_action, name="cluster-action"),
]
