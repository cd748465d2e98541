"""Calling a cluster's URL through the real gateway, one request or a steady load."""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass, field

from marketplace.clusters import routes
from marketplace.models import ApiKey, Cluster
from marketplace.services.accounts import api_key_create
from scheduler import gateway as gw

IMAGE = "gpumkt/busybox:latest"
# Two busybox httpd servers answering with the container's name (its hostname), on 8080 and
# 8081; the shell as PID 1 exits at once on `docker stop` (a bare PID 1 ignores SIGTERM).
SERVE_NAME = [
    "-c",
    "trap 'exit 0' TERM; mkdir -p /www; hostname > /www/index.html;"
    " httpd -f -p 8080 -h /www & httpd -f -p 8081 -h /www & wait",
]
CLUSTER = {
    "name": "web", "image": IMAGE, "entrypoint": "sh", "args": SERVE_NAME,
    "gpu_names": ["RTX 4090"], "gpus_per_replica": 1, "replicas": 3, "disk_gb": 1,
    "duration_hours": 2, "service_port": 8080,
}  # fmt: skip


def call(port: int, path: str, headers: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace").strip()
    finally:
        conn.close()


def routed(caddy_admin: str, cluster_id: int) -> set[str]:
    """The replica addresses the gateway balances the cluster's URL over now."""
    mine = [
        r for r in gw.CaddyAdmin(caddy_admin).routes() if r.get("@id") == f"cluster-{cluster_id}"
    ]
    return gw.routed_upstreams(mine)


def routes_settle(caddy_admin: str, cluster_id: int, count: int, timeout: float = 30) -> set[str]:
    """Push the routes (as the worker's retries would) until ``count`` replicas are routed."""
    deadline = time.monotonic() + timeout
    while True:
        routes.routes_push()
        now = routed(caddy_admin, cluster_id)
        if len(now) == count:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(now)} replicas routed, not {count}")
        time.sleep(0.2)


def rolled(caddy_admin: str, cluster, image: str, count: int, timeout: float = 60) -> set[str]:
    """Push the routes (as the worker's retries would: each newly answering replica lets the
    roll take its next step) until ``count`` replicas of ``image`` run and are all routed."""
    deadline = time.monotonic() + timeout
    while True:
        routes.routes_push()
        running = cluster.deployment.replicas.filter(state="running").select_related("instance")
        now = routed(caddy_admin, cluster.pk)
        images = [r.instance.image for r in running]
        if images == [image] * count and len(now) == count:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"not rolled: running {images}, {len(now)} routed")
        time.sleep(0.2)


def pushing_until(done, timeout: float = 60) -> None:
    """Push the routes (as the worker's retries would) until ``done()``."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError("never done")
        routes.routes_push()
        time.sleep(0.2)


@dataclass
class Load:
    """Requests at a steady rate through the gateway from a background thread, each recorded
    as (status or the exception's name, body)."""

    port: int
    path: str
    headers: dict
    rate: float
    results: list[tuple[object, str]] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        interval = 1 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.results.append(call(self.port, self.path, self.headers, timeout=10))
            except Exception as error:  # a failed request is what is measured
                self.results.append((type(error).__name__, str(error)))
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def more(self, count: int, timeout: float = 60) -> None:
        """Wait until ``count`` more requests have been answered (or have failed): traffic
        for a while, however slowly a busy machine lets it flow."""
        wanted = len(self.results) + count
        deadline = time.monotonic() + timeout
        while len(self.results) < wanted:
            if time.monotonic() > deadline:
                raise AssertionError(f"{wanted - len(self.results)} requests still unanswered")
            time.sleep(0.05)

    @property
    def failed(self) -> list[tuple[object, str]]:
        return [r for r in self.results if r[0] != 200]


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def key_secret(team, access=ApiKey.Access.READ) -> str:
    membership = team.memberships.filter(role="owner").first()
    return api_key_create(membership=membership, name="svc", access=access).secret


def create(client, **overrides) -> dict:
    response = client.post("/api/v1/clusters/", {**CLUSTER, **overrides}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def path_of(url: str) -> str:
    return "/" + url.split("/", 3)[3]


@dataclass
class Serving:
    """A cluster made through the API whose replicas are all routed by the gateway."""

    path: str
    routed: set[str]
    key: dict
    cluster: Cluster


def serving(client, team, gateway, **overrides) -> Serving:
    created = create(client, **overrides)
    routed_now = routes_settle(gateway.admin, created["id"], created["replicas"])
    return Serving(
        path=path_of(created["url"]),
        routed=routed_now,
        key=bearer(key_secret(team)),
        cluster=Cluster.objects.get(pk=created["id"]),
    )
