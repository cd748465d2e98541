"""What the gateway is told, and when: every cluster with a service port gets a route over
its running replicas; the routes are pushed whenever a replica starts or ends, a port
changes, a cluster stops, resumes or goes.

Pushed on commit, from the transaction that changed things, and level-triggered (the whole
route list is computed from the database each time), so pushes never drift and a missed one
is mended by the next (the beat's ``gateway_routes_write`` too). Each push also checks again
the keys the gateway lets through by itself while the web processes are down
(``remembered``), and adds those a web process in this process let through since. A replica that ends is taken
out of the gateway before its container is stopped: the reconciler tells us before it
queues the destroy, and this push runs first on commit. A replica that starts running is
added only once it answers (``scheduler.gateway.answering``); from then on Caddy's own health
checks watch it.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import connection, transaction
from django.dispatch import receiver
from django.utils import timezone

from core.task_queue import task_queue
from marketplace.clusters import remembered, traffic
from marketplace.deployments import reconciler, rolling
from marketplace.models import Cluster, Replica
from marketplace.models.clusters import ClusterState
from marketplace.models.deployments import ReplicaState
from marketplace.signals import access_lost
from scheduler import gateway

logger = logging.getLogger(__name__)


def gateway_url(cluster_id: int) -> str | None:
    """The cluster's URL as its users call it, or None where no gateway is configured."""
    base = settings.GATEWAY_URL.rstrip("/")
    return f"{base}/clusters/{cluster_id}/service/" if base else None


def _admin() -> gateway.CaddyAdmin | None:
    return gateway.CaddyAdmin(settings.GATEWAY_ADMIN) if settings.GATEWAY_ADMIN else None


@dataclass(frozen=True)
class _Running:
    """A running replica as the routes see it: where it answers, and whether it has yet."""

    replica_id: int
    deployment_id: int
    upstream: str
    ready: bool


def current_routes() -> tuple[list[gateway.ClusterRoute], list[_Running]]:
    """Every cluster with a port, over its running replicas' published ports; and those
    replicas."""
    clusters = list(
        Cluster.objects.exclude(service_port=None)
        .exclude(state=ClusterState.ENDED)
        .values_list("pk", "deployment_id", "service_port", "state")
    )
    rows = Replica.objects.filter(
        deployment_id__in=[c[1] for c in clusters], state=ReplicaState.RUNNING
    ).values_list("deployment_id", "instance_id", "pk", "ready_at")
    by_deployment: dict[int, list[tuple[int, int, object]]] = {}
    for deployment_id, instance_id, replica_id, ready_at in rows:
        by_deployment.setdefault(deployment_id, []).append((instance_id, replica_id, ready_at))
    out, running = [], []
    for cluster_id, deployment_id, port, state in clusters:
        replicas = by_deployment.get(deployment_id, [])
        upstreams = gateway.replica_upstreams([r[0] for r in replicas], port) if replicas else {}
        for instance_id, replica_id, ready_at in replicas:
            if instance_id in upstreams:
                running.append(
                    _Running(
                        replica_id, deployment_id, upstreams[instance_id], ready_at is not None
                    )
                )
        out.append(
            gateway.ClusterRoute(
                cluster_id=cluster_id,
                upstreams=tuple(sorted(upstreams.values())),
                running=state == ClusterState.RUNNING,
            )
        )
    return out, running


def routes_push() -> bool:
    """Compute the routes and give them to the gateway; False where it did not take them (or
    none is configured, or a running replica does not answer yet). New replicas go in only
    once they answer; then they are marked ready and their deployments woken (a roll waits
    for that behind a cluster's URL).

    One push at a time across processes (a Redis lock), each reading the database inside the
    lock: two pushes racing could otherwise land out of order, the older routes last."""
    admin = _admin()
    if admin is None:
        return False
    try:
        lock = traffic.redis_client().lock(
            f"{traffic.key_prefix()}:gateway:routes", timeout=30, blocking_timeout=15
        )
        locked = lock.acquire()
    except redis.RedisError:
        lock, locked = None, False
    try:
        complete, woken = _push(admin)
    finally:
        if locked:
            with contextlib.suppress(redis.RedisError):
                lock.release()
    for deployment_id in sorted(woken):  # after the lock: a pass may push again
        task_queue("marketplace.tasks.deployment_reconcile", deployment_id)
    return complete


# The web process's pusher of remembered keys pushes with this (remembered cannot import it).
remembered.push_with(routes_push)


def _push(admin: gateway.CaddyAdmin) -> tuple[bool, set[int]]:
    new_keys = remembered.pending_take()
    try:
        admin.persist_off()
        if settings.GATEWAY_LISTEN and admin.server_ensure(settings.GATEWAY_LISTEN):
            logger.info("gateway server added to the proxy on %s", settings.GATEWAY_LISTEN)
        server = admin.server(settings.GATEWAY_SERVER)
        existing = server.get("routes") or []
        existing_errors = (server.get("errors") or {}).get("routes") or []
        known = gateway.routed_upstreams([r for r in existing if gateway.is_cluster_route(r)])
        wanted, running = current_routes()
        keys = _remembered_keys(gateway.remembered_keys(existing_errors), new_keys)
        routes = []
        for route in wanted:
            ready = gateway.answering(route.upstreams, known)
            upstreams = tuple(u for u in route.upstreams if u in ready)
            headers = remembered.as_headers(keys.get(route.cluster_id, ()))
            routes.append(gateway.ClusterRoute(route.cluster_id, upstreams, route.running, headers))
        ours = gateway.cluster_routes(
            routes,
            auth_upstream=settings.GATEWAY_AUTH_UPSTREAM,
            session_cookie=settings.SESSION_COOKIE_NAME,
        )
        fallback = gateway.fallback_routes(routes, session_cookie=settings.SESSION_COOKIE_NAME)
        merged = gateway.merged_routes(existing, ours)
        merged_errors = gateway.merged_routes(existing_errors, fallback)
        # Every change reloads Caddy's config: none when nothing changed, one when both did.
        if merged != existing or merged_errors != existing_errors:
            errors = {**(server.get("errors") or {}), "routes": merged_errors}
            admin.set_server(
                {**server, "routes": merged, "errors": errors}, settings.GATEWAY_SERVER
            )
        remembered.pushed(keys)
        routed = {u for r in routes for u in r.upstreams}
        gone = known - routed
        if gone:
            gateway.drained(admin, gone)
    except gateway.GatewayUnavailable as error:
        logger.warning("gateway routes not pushed: %s", error)
        remembered.pending_put_back(new_keys)
        return False, set()
    newly = [r for r in running if not r.ready and r.upstream in routed]
    if newly:
        Replica.objects.filter(pk__in=[r.replica_id for r in newly], ready_at=None).update(
            ready_at=timezone.now()
        )
    complete = all(
        len(r.upstreams) == len(w.upstreams) for r, w in zip(routes, wanted, strict=True)
    )
    return complete, {r.deployment_id for r in newly}


def _remembered_keys(
    remembered_now: dict[int, set[str]], new_keys: dict[int, set[str]]
) -> dict[int, set[str]]:
    """The keys each cluster's fallback lets through after this push: those it remembers
    and those a web process just let through, each checked again."""
    candidates = remembered.from_headers(remembered_now)
    for cluster_id, keys in new_keys.items():
        candidates.setdefault(cluster_id, set()).update(keys)
    if not any(candidates.values()):
        return {}
    teams = dict(
        Cluster.objects.filter(pk__in=list(candidates))
        .exclude(state=ClusterState.ENDED)
        .values_list("pk", "team_id")
    )
    return remembered.still_allowed(candidates, teams)


def _push_on_commit() -> None:
    """On commit: push now (before anything queued after it, such as a replica's destroy);
    where the gateway did not take it, or a replica did not answer yet, the task tries again."""
    if not settings.GATEWAY_ADMIN:
        return
    if not routes_push() and not settings.CELERY_TASK_ALWAYS_EAGER:
        task_queue("marketplace.tasks.gateway_routes_write", countdown=1)


def routes_changed() -> None:
    """Push the routes once the current transaction commits (once per transaction)."""
    if connection.in_atomic_block and any(
        func is _push_on_commit for _, func, _ in connection.run_on_commit
    ):
        return
    transaction.on_commit(_push_on_commit)


@receiver(access_lost, dispatch_uid="marketplace.clusters.routes.access_lost")
def _on_access_lost(**kwargs: object) -> None:
    """A key revoked or a member gone: the gateway forgets what no longer passes."""
    routes_changed()


def _replica_changed(replica: Replica) -> None:
    if Cluster.objects.filter(deployment_id=replica.deployment_id).exists():
        routes_changed()


def _readiness(deployment) -> str:
    """A roll behind a cluster's URL waits for each new replica to answer there."""
    port = (
        Cluster.objects.filter(deployment=deployment, service_port__isnull=False)
        .values_list("service_port", flat=True)
        .first()
    )
    return f"answer on port {port} at the cluster's URL" if port else ""


reconciler.replica_service_hooks.append(_replica_changed)
rolling.readiness_gates.append(_readiness)
