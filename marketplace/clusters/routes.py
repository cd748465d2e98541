"""What the gateway is told, and when: every cluster with a service port gets a route over
its running replicas; the routes are pushed whenever a replica starts or ends, a port
changes, a cluster stops, resumes or goes.

Pushed on commit, from the transaction that changed things, and level-triggered (the whole
route list is computed from the database each time), so pushes never drift and a missed one
is mended by the next (the beat's ``gateway_routes_write`` too). A replica that ends is taken
out of the gateway before its container is stopped: the reconciler tells us before it
queues the destroy, and this push runs first on commit. A replica that starts running is
added only once it answers (``scheduler.gateway.answering``); from then on Caddy's own health
checks watch it.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection, transaction

from marketplace.deployments import reconciler
from marketplace.models import Cluster, Replica
from marketplace.models.clusters import ClusterState
from marketplace.models.deployments import ReplicaState
from scheduler import gateway

logger = logging.getLogger(__name__)


def gateway_url(cluster_id: int) -> str | None:
    """The cluster's URL as its users call it, or None where no gateway is configured."""
    base = settings.GATEWAY_URL.rstrip("/")
    return f"{base}/clusters/{cluster_id}/service/" if base else None


def _admin() -> gateway.CaddyAdmin | None:
    return gateway.CaddyAdmin(settings.GATEWAY_ADMIN) if settings.GATEWAY_ADMIN else None


def current_routes() -> list[gateway.ClusterRoute]:
    """Every cluster with a port, over its running replicas' published ports."""
    clusters = list(
        Cluster.objects.exclude(service_port=None)
        .exclude(state=ClusterState.ENDED)
        .values_list("pk", "deployment_id", "service_port", "state")
    )
    running = Replica.objects.filter(
        deployment_id__in=[c[1] for c in clusters], state=ReplicaState.RUNNING
    ).values_list("deployment_id", "instance_id")
    by_deployment: dict[int, list[int]] = {}
    for deployment_id, instance_id in running:
        by_deployment.setdefault(deployment_id, []).append(instance_id)
    out = []
    for cluster_id, deployment_id, port, state in clusters:
        instances = by_deployment.get(deployment_id, [])
        upstreams = gateway.instance_upstreams(instances, port) if instances else {}
        out.append(
            gateway.ClusterRoute(
                cluster_id=cluster_id,
                upstreams=tuple(sorted(upstreams.values())),
                running=state == ClusterState.RUNNING,
            )
        )
    return out


def routes_push() -> bool:
    """Compute the routes and give them to the gateway; False where it did not take them (or
    none is configured). New replicas go in only once they answer."""
    admin = _admin()
    if admin is None:
        return False
    try:
        if settings.GATEWAY_LISTEN and admin.server_ensure(settings.GATEWAY_LISTEN):
            logger.info("gateway server added to the proxy on %s", settings.GATEWAY_LISTEN)
        known = gateway.routed_upstreams(admin.routes())
        wanted = current_routes()
        routes = []
        for route in wanted:
            ready = gateway.answering(route.upstreams, known)
            upstreams = tuple(u for u in route.upstreams if u in ready)
            routes.append(gateway.ClusterRoute(route.cluster_id, upstreams, route.running))
        admin.set_routes(
            gateway.cluster_routes(
                routes,
                auth_upstream=settings.GATEWAY_AUTH_UPSTREAM,
                session_cookie=settings.SESSION_COOKIE_NAME,
            )
        )
    except gateway.GatewayUnavailable as error:
        logger.warning("gateway routes not pushed: %s", error)
        return False
    return all(len(r.upstreams) == len(w.upstreams) for r, w in zip(routes, wanted, strict=True))


def _push_on_commit() -> None:
    """On commit: push now (before anything queued after it, such as a replica's destroy);
    where the gateway did not take it, or a replica did not answer yet, the task tries again."""
    from marketplace import tasks  # the tasks module imports this one

    if not settings.GATEWAY_ADMIN:
        return
    if not routes_push() and not settings.CELERY_TASK_ALWAYS_EAGER:
        tasks.gateway_routes_write.apply_async(countdown=1)


def routes_changed() -> None:
    """Push the routes once the current transaction commits (once per transaction)."""
    if connection.in_atomic_block and any(
        func is _push_on_commit for _, func, _ in connection.run_on_commit
    ):
        return
    transaction.on_commit(_push_on_commit)


def _replica_changed(replica: Replica) -> None:
    if Cluster.objects.filter(deployment_id=replica.deployment_id).exists():
        routes_changed()


reconciler.replica_service_hooks.append(_replica_changed)
