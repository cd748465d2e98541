"""The paths of vast.ai's serverless commands (CLI 1.9.1, vastai/api/endpoints.py): endpoints
at /api/v0/endptjobs/, workergroups at /api/v0/autojobs/, and what the CLI sends to vast.ai's
autoscaler, which with ``--url`` is this site's root: /get_endpoint_workers/,
/get_endpoint_logs/, /get_autogroup_logs/ and /update_workers/ (POST, the key as a Bearer
header and again in the body, where it is not read). The mapping is marketplace/vast/serverless.py.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from marketplace.api.fields import clamped_whole
from marketplace.models import Cluster
from marketplace.models.deployments import PLACED_REPLICA_STATES
from marketplace.selectors import instance_logs
from marketplace.vast import serverless
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, RenterView

LOG_LEVELS = ("info0", "info1", "trace", "debug")
DEFAULT_TAIL = 200


def _schema(summary: str):
    return extend_schema(
        summary=f"vast.ai: {summary}",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )


class Endpoints(RenterView):
    """``show endpoints`` (GET), ``create endpoint`` (POST)."""

    @_schema("show endpoints")
    def get(self, request):
        rows = [serverless.endpoint_row(e) for e in serverless.team_endpoints(self.team)]
        return Response({"success": True, "results": rows})

    @_schema("create endpoint")
    def post(self, request):
        endpoint = serverless.endpoint_create(team=self.team, body=self.body())
        return Response(
            {"success": True, "result": endpoint.pk, "endpoint": serverless.endpoint_row(endpoint)}
        )


class EndpointDetail(RenterView):
    """``update endpoint ID`` (PUT), ``delete endpoint ID`` (DELETE)."""

    @_schema("update endpoint")
    def put(self, request, pk: int):
        endpoint = serverless.team_endpoint(self.team, pk)
        endpoint = serverless.endpoint_update(endpoint=endpoint, body=self.body())
        endpoint = serverless.team_endpoint(self.team, pk)
        return Response({"success": True, "endpoint": serverless.endpoint_row(endpoint)})

    @_schema("delete endpoint")
    def delete(self, request, pk: int):
        serverless.endpoint_delete(endpoint=serverless.team_endpoint(self.team, pk))
        return Response({"success": True, "msg": f"Endpoint {pk} deleted."})


class Workergroups(RenterView):
    """``show workergroups`` (GET), ``create workergroup`` (POST)."""

    @_schema("show workergroups")
    def get(self, request):
        rows = [serverless.workergroup_row(w) for w in serverless.team_workergroups(self.team)]
        return Response({"success": True, "results": rows})

    @_schema("create workergroup")
    def post(self, request):
        workergroup = serverless.workergroup_create(team=self.team, body=self.body())
        workergroup = serverless.team_workergroup(self.team, workergroup.pk)
        return Response(
            {
                "success": True,
                "id": workergroup.pk,
                "workergroup": serverless.workergroup_row(workergroup),
            }
        )


class WorkergroupDetail(RenterView):
    """``update workergroup ID`` (PUT), ``delete workergroup ID`` (DELETE)."""

    @_schema("update workergroup")
    def put(self, request, pk: int):
        workergroup = serverless.team_workergroup(self.team, pk)
        serverless.workergroup_update(workergroup=workergroup, body=self.body())
        workergroup = serverless.team_workergroup(self.team, pk)
        return Response({"success": True, "workergroup": serverless.workergroup_row(workergroup)})

    @_schema("delete workergroup")
    def delete(self, request, pk: int):
        serverless.workergroup_delete(workergroup=serverless.team_workergroup(self.team, pk))
        return Response({"success": True, "msg": f"Workergroup {pk} deleted."})


# --- vast.ai's autoscaler paths, at the site's root ------------------------------------------


class AutoscalerView(RenterView):
    """POSTs that read (workers, logs): read-only keys may use them. Outside /api/v0/, so in
    neither API description: /api/v1/schema/ promises v1's error shape, and /api/v0/schema/
    describes the paths under /api/v0/ (tests/vast/test_serverless.py tries these)."""

    read_only_methods = frozenset({"POST"})
    schema = None

    def tail(self) -> int:
        try:
            return clamped_whole(self.body().get("tail") or DEFAULT_TAIL, 1, 5000)
        except ValueError:
            raise Refused("--tail is a whole number of lines.", field="tail") from None


def workers_log(cluster: Cluster | None, tail: int) -> str:
    """Each placed worker's last ``tail`` lines, headed by its instance id."""
    if cluster is None:
        return "No workers: no workergroup has made the endpoint's cluster (or it was deleted)."
    replicas = (
        cluster.deployment.replicas.filter(state__in=PLACED_REPLICA_STATES)
        .select_related("instance__machine")
        .order_by("pk")
    )
    parts = []
    for replica in replicas:
        text, note = instance_logs(replica.instance, tail=tail)
        parts.append(f"== worker {replica.instance_id} ({replica.state}) ==\n{text or note}")
    return "\n".join(parts) if parts else "No workers are placed yet."


def log_levels(text: str) -> dict[str, Any]:
    """The CLI prints the level it was asked for; a container has one log, at every level."""
    return {"success": True, **dict.fromkeys(LOG_LEVELS, text)}


class EndpointWorkers(AutoscalerView):
    """``get endpt-workers ID``: the endpoint's workers (its cluster's live replicas)."""

    @_schema("get endpt-workers")
    def post(self, request):
        endpoint = serverless.team_endpoint(self.team, self.body().get("id"))
        workergroup = getattr(endpoint, "workergroup", None)
        cluster = workergroup.cluster if workergroup is not None else None
        return Response(serverless.cluster_workers(cluster))


class EndpointLogs(AutoscalerView):
    """``get endpt-logs ID [--tail N]``."""

    @_schema("get endpt-logs")
    def post(self, request):
        endpoint = serverless.team_endpoint(self.team, self.body().get("id"))
        workergroup = getattr(endpoint, "workergroup", None)
        cluster = workergroup.cluster if workergroup is not None else None
        return Response(log_levels(workers_log(cluster, self.tail())))


class WorkergroupLogs(AutoscalerView):
    """``get wrkgrp-logs ID [--tail N]``."""

    @_schema("get wrkgrp-logs")
    def post(self, request):
        workergroup = serverless.team_workergroup(self.team, self.body().get("id"))
        return Response(log_levels(workers_log(workergroup.cluster, self.tail())))


class UpdateWorkers(RenterView):
    """``update workers ID``: the template's current settings rolled onto the workers (in no
    API description, as ``AutoscalerView``)."""

    schema = None

    @_schema("update workers")
    def post(self, request):
        body = self.body()
        if body.get("cancel_update"):
            raise Refused(
                "--cancel is not supported: a roll here goes on, one worker at a time, to the "
                "end; update the template and the workers again to roll back.",
                field="cancel",
            )
        workergroup = serverless.team_workergroup(self.team, body.get("workergroup_id"))
        count = serverless.workers_update(workergroup=workergroup)
        return Response({"success": True, "workers_to_update": count})
