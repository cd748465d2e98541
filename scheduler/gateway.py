"""The gateway's routes: which replicas answer a cluster's URL, and the Caddy config that says so.

The gateway is Caddy 2 (a real reverse proxy from Debian). Its config is JSON pushed over its
admin API; every change reloads gracefully (connections in flight finish on the old config).
A reload closes the old listening socket (Caddy 2.6 listens anew with SO_REUSEPORT), and the
kernel resets the connections still queued on it unless ``net.ipv4.tcp_migrate_req`` is 1
(the Caddy unit's drop-in sets it; tests/clusters/test_gateway_reload.py): so a push is one
reload (routes and error routes in one request) and none when nothing changed.
Each cluster with a service port gets one route, ``/clusters/<id>/service/*``:

1. ``forward_auth``: a sub-request to the web servers' ``/gateway/auth/<id>/`` with the
   caller's headers; a 2xx lets the request through, anything else (401) is answered as is.
2. The platform's own credentials are taken off the request (the caller's API key and session
   cookie are for the platform, not for the renter's container).
3. ``reverse_proxy`` over the replicas' published ports, round robin, with active health
   checks (a replica that stops answering leaves the rotation within a second or two), passive
   ones (a replica that refuses a connection is skipped for a while) and retries on another
   replica for a request that could not reach one (so a replica that died between two health
   checks costs a retry, not a failed request).

Anything else under ``/clusters/`` answers the same 401 as a refused request: a caller
without access cannot tell a cluster that exists from one that does not.

While no web process answers the sub-request (a deploy, a crash), the gateway still lets
through the API keys the web processes let through recently: each cluster's route has a
fallback among the server's error routes (``cluster-<id>-remembered``) that matches those
keys' ``Authorization`` headers exactly and goes on to step 2. The keys are the ones the web
processes pushed (marketplace/clusters/routes.py), each push checking every one again, so a
revoked key leaves the fallback with the push its revocation makes.

This module builds the config (pure) and speaks to the admin API (stdlib HTTP); which
clusters exist and who may call them is the marketplace's business.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from scheduler.models import PortAllocation

SERVER = "gateway"  # the server gateway_config makes; production's Caddyfile names its own
OTHER_CLUSTERS = "clusters-other"
UNAUTHORIZED_BODY = '{"detail": "Authentication required."}'
# Caddy's durations are nanoseconds.
SECOND = 1_000_000_000
# The variable naming the cluster whose forward-auth sub-request is under way: set before
# it, cleared once it passes, so only a sub-request that failed reaches the fallback.
AUTH_PENDING = "gateway_auth_pending"


@dataclass(frozen=True)
class ClusterRoute:
    cluster_id: int
    upstreams: tuple[str, ...]  # "address:port" of each running replica's published port
    running: bool = True  # a stopped cluster keeps its URL: authenticated, then 503
    # "Bearer gpk_…" of each key the gateway lets through by itself while no web process
    # answers its sub-request
    remembered: tuple[str, ...] = ()


def replica_upstreams(instance_ids: Iterable[int], service_port: int) -> dict[int, str]:
    """Where each replica serves a cluster whose service port is ``service_port``: that port
    where the replica publishes it; else the one port it does publish. A replica placed before
    the port moved publishes the old port and serves there until the roll replaces it, so the
    URL never has no replica while the first new one starts."""
    rows = PortAllocation.objects.filter(
        instance_id__in=list(instance_ids), released_at=None
    ).values_list("instance_id", "container_port", "machine__address", "host_port")
    published: dict[int, dict[int, str]] = {}
    for instance_id, container_port, address, port in rows:
        published.setdefault(instance_id, {})[container_port] = f"{address}:{port}"
    out = {}
    for instance_id, ports in published.items():
        if service_port in ports:
            out[instance_id] = ports[service_port]
        elif len(ports) == 1:
            [out[instance_id]] = ports.values()
    return out


def answers(upstream: str, path: str = "/", timeout: float = 1.0) -> bool:
    """Whether an HTTP server at ``upstream`` answers at all (any status): a replica is added
    to the rotation only once it does."""
    host, _, port = upstream.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(f"HEAD {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            return conn.recv(12).startswith(b"HTTP/")
    except (OSError, ValueError):
        return False


def answering(upstreams: Iterable[str], known: set[str]) -> set[str]:
    """Those of ``upstreams`` the gateway already routes to (its health checks watch them), or
    that answer now."""
    new = [u for u in upstreams if u not in known]
    if not new:
        return set(upstreams)
    with ThreadPoolExecutor(max_workers=min(len(new), 16)) as pool:
        ok = {u for u, up in zip(new, pool.map(answers, new), strict=True) if up}
    return {u for u in upstreams if u in known or u in ok}


def _unauthorized() -> dict:
    return {
        "handler": "static_response",
        "status_code": 401,
        "headers": {
            "Content-Type": ["application/json"],
            "Www-Authenticate": ['Bearer realm="cluster"'],
        },
        "body": UNAUTHORIZED_BODY,
    }


def _forward_auth(cluster_id: int, auth_upstream: str) -> dict:
    """Caddy's ``forward_auth`` directive, as ``caddy adapt`` writes it in JSON, to one web
    process or several (``auth_upstream`` comma-separated)."""
    dials = [u.strip() for u in auth_upstream.split(",") if u.strip()]
    return {
        "handler": "reverse_proxy",
        "upstreams": [{"dial": dial} for dial in dials],
        # A web process restarting is waited for a little; past that, the remembered keys'
        # fallback answers (the error routes) and any other caller gets the 502.
        "load_balancing": {"try_duration": SECOND // 2, "try_interval": SECOND // 20},
        "rewrite": {"method": "GET", "uri": f"/gateway/auth/{cluster_id}/"},
        "headers": {
            "request": {
                "set": {
                    "Host": [dials[0]],
                    "X-Forwarded-Method": ["{http.request.method}"],
                    "X-Forwarded-Uri": ["{http.request.uri}"],
                },
                "delete": ["Content-Length"],
            }
        },
        "handle_response": [
            {"match": {"status_code": [2]}, "routes": [{"handle": [{"handler": "headers"}]}]}
        ],
    }


def _strip_platform_credentials(session_cookie: str) -> list[dict]:
    """Routes that take the platform's API key and session cookie off a request before it
    goes to the renter's container."""
    return [
        {
            "match": [{"header_regexp": {"Authorization": {"pattern": "(?i)^\\s*bearer\\s+gpk_"}}}],
            "handle": [{"handler": "headers", "request": {"delete": ["Authorization"]}}],
        },
        {
            "handle": [
                {
                    "handler": "headers",
                    "request": {
                        "replace": {
                            "Cookie": [
                                {"search_regexp": f"(^|;\\s*){session_cookie}=[^;]*", "replace": ""}
                            ]
                        }
                    },
                }
            ]
        },
    ]


def _balancer(upstreams: tuple[str, ...], health_path: str) -> dict:
    return {
        "handler": "reverse_proxy",
        "upstreams": [{"dial": u} for u in upstreams],
        "load_balancing": {
            "selection_policy": {"policy": "round_robin"},
            # A request that could not reach a replica (refused, reset before an answer) is
            # tried on another for up to 5 s: a dying replica costs retries, not failures.
            "try_duration": 5 * SECOND,
            "try_interval": SECOND // 20,
        },
        "health_checks": {
            # A replica slow to answer under load is not down: give it as long as the web's
            # own checks do (deploy/Caddyfile), or a busy machine sees every replica marked
            # down and the gateway answers 503. A refused connection still counts at once.
            "active": {"uri": health_path, "interval": SECOND, "timeout": 3 * SECOND},
            "passive": {"fail_duration": 10 * SECOND, "max_fails": 1},
        },
    }


def cluster_routes(
    routes: Iterable[ClusterRoute], *, auth_upstream: str, session_cookie: str, health_path="/"
) -> list[dict]:
    """The gateway server's routes for these clusters, then the 401 for any other cluster."""
    out = []
    for route in sorted(routes, key=lambda r: r.cluster_id):
        prefix = _prefix(route.cluster_id)
        handle: list[dict] = [
            {"handler": "rewrite", "strip_path_prefix": prefix},
            {"handler": "vars", AUTH_PENDING: str(route.cluster_id)},
            _forward_auth(route.cluster_id, auth_upstream),
            {"handler": "vars", AUTH_PENDING: ""},
            *_serve(route, session_cookie, health_path),
        ]
        out.append(
            {
                "@id": f"cluster-{route.cluster_id}",
                "match": [{"path": [prefix, f"{prefix}/*"]}],
                "handle": [{"handler": "subroute", "routes": [{"handle": handle}]}],
                "terminal": True,
            }
        )
    out.append(
        {"@id": OTHER_CLUSTERS, "match": [{"path": ["/clusters/*"]}], "handle": [_unauthorized()]}
    )
    return out


def _prefix(cluster_id: int) -> str:
    return f"/clusters/{cluster_id}/service"


def _serve(route: ClusterRoute, session_cookie: str, health_path: str) -> list[dict]:
    """What an authenticated request to the cluster's URL meets."""
    if route.running and route.upstreams:
        return [
            {"handler": "subroute", "routes": _strip_platform_credentials(session_cookie)},
            _balancer(route.upstreams, health_path),
        ]
    why = "is stopped" if not route.running else "has no replica answering yet"
    return [
        {
            "handler": "static_response",
            "status_code": 503,
            "headers": {"Content-Type": ["application/json"], "Retry-After": ["5"]},
            "body": json.dumps({"detail": f"The cluster {why}."}),
        }
    ]


def remembered_id(cluster_id: int) -> str:
    return f"cluster-{cluster_id}-remembered"


def fallback_routes(
    routes: Iterable[ClusterRoute], *, session_cookie: str, health_path="/"
) -> list[dict]:
    """The server's error routes for these clusters: a request whose forward-auth sub-request
    failed (no web process answered) and that carries one of the cluster's remembered keys
    is served as if the sub-request had passed; any other error is answered as it is."""
    out = []
    for route in sorted(routes, key=lambda r: r.cluster_id):
        if not route.remembered:
            continue
        out.append(
            {
                "@id": remembered_id(route.cluster_id),
                "match": [
                    {
                        "vars": {AUTH_PENDING: [str(route.cluster_id)]},
                        "header": {"Authorization": sorted(route.remembered)},
                    }
                ],
                "handle": [
                    # Caddy gives error routes the request as it came in: the prefix again.
                    {"handler": "rewrite", "strip_path_prefix": _prefix(route.cluster_id)},
                    {"handler": "vars", AUTH_PENDING: ""},
                    *_serve(route, session_cookie, health_path),
                ],
                "terminal": True,
            }
        )
    return out


def remembered_keys(errors: list[dict]) -> dict[int, set[str]]:
    """The ``Authorization`` values each cluster's fallback lets through now."""
    out: dict[int, set[str]] = {}
    for route in errors:
        route_id = route.get("@id", "")
        if not (route_id.startswith("cluster-") and route_id.endswith("-remembered")):
            continue
        cluster_id = int(route_id.split("-")[1])
        for matcher in route.get("match", []):
            out.setdefault(cluster_id, set()).update(
                matcher.get("header", {}).get("Authorization", [])
            )
    return out


def is_cluster_route(route: dict) -> bool:
    """Whether a route of the server is one of ours (the rest are the server's own: in
    production, the proxy to the web processes from the Caddyfile)."""
    route_id = route.get("@id", "")
    return route_id == OTHER_CLUSTERS or route_id.startswith("cluster-")


def merged_routes(existing: list[dict], clusters: list[dict]) -> list[dict]:
    """The server's routes with ours replaced: ours first (they match /clusters/ only), then
    the server's own, as they were."""
    return clusters + [r for r in existing if not is_cluster_route(r)]


def server_config(*, listen: str, routes: list[dict], errors: list[dict] = ()) -> dict:
    """The gateway's own HTTP server on ``listen``."""
    return {
        "listen": [listen],
        "routes": routes,
        "errors": {"routes": list(errors)},
        "automatic_https": {"disable": True},
        "metrics": {},
    }


def gateway_config(*, admin: str, listen: str, routes: list[dict]) -> dict:
    """A whole Caddy config: the admin API on ``admin``, one HTTP server on ``listen``."""
    return {
        # Not saved to disk: the remembered keys' fallback holds keys as callers send them.
        "admin": {"listen": admin, "config": {"persist": False}},
        "apps": {"http": {"servers": {SERVER: server_config(listen=listen, routes=routes)}}},
    }


class GatewayUnavailable(Exception):
    """The gateway's admin API did not take the config."""


class CaddyAdmin:
    """Caddy's admin API (``http://<admin>/``): load a whole config, read and replace routes."""

    def __init__(self, admin: str, timeout: float = 5.0):
        self.host, _, port = admin.rpartition(":")
        self.port = int(port)
        self.timeout = timeout

    def _call(self, method: str, path: str, body: object | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
        except OSError as error:
            raise GatewayUnavailable(f"{method} {path}: {error}") from error
        finally:
            conn.close()
        if response.status >= 300:
            raise GatewayUnavailable(f"{method} {path}: {response.status} {raw[:300]!r}")
        return raw

    def load(self, config: dict) -> None:
        self._call("POST", "/load", config)

    def server_ensure(self, listen: str) -> bool:
        """Add the gateway's server to the running config, beside whatever else Caddy serves
        (in production, the Caddyfile's site), unless it is there. True when it was added:
        Caddy was (re)started or reloaded from a config that knows nothing of it, down to
        one with no HTTP app at all (asking for the server's path then answers 400, so the
        whole config is read and the server put in at the deepest level that exists)."""
        config = json.loads(self._call("GET", "/config/") or b"null")
        if not config:
            # Nothing at all, not even its admin address: the whole gateway config, keeping
            # the admin API where we reach it.
            self.load(gateway_config(admin=f"{self.host}:{self.port}", listen=listen, routes=[]))
            return True
        levels = ("apps", "http", "servers", SERVER)
        path, node = "/config", config
        for depth, key in enumerate(levels):
            if not isinstance(node, dict) or node.get(key) is None:
                value: dict = server_config(listen=listen, routes=[])
                for wrapper in reversed(levels[depth + 1 :]):
                    value = {wrapper: value}
                self._call("POST", f"{path}/{key}", value)
                return True
            path, node = f"{path}/{key}", node[key]
        return False

    def persist_off(self) -> None:
        """Caddy saves every config change to disk (autosave.json) unless told not to, and
        the remembered keys' fallback holds API keys as callers send them: a Caddy started
        from a Caddyfile (production's; 2.6 has no Caddyfile option for it) is told before
        any key is pushed. Its admin address stays as it is."""
        admin = json.loads(self._call("GET", "/config/admin") or b"null")
        if isinstance(admin, dict) and (admin.get("config") or {}).get("persist") is not False:
            self._call("POST", "/config/admin/config", {"persist": False})

    def routes(self, server: str = SERVER) -> list[dict]:
        raw = self._call("GET", f"/config/apps/http/servers/{server}/routes")
        return json.loads(raw or b"null") or []

    def set_routes(self, routes: list[dict], server: str = SERVER) -> None:
        self._call("PATCH", f"/config/apps/http/servers/{server}/routes", routes)

    def server(self, server: str = SERVER) -> dict:
        raw = self._call("GET", f"/config/apps/http/servers/{server}")
        return json.loads(raw or b"null") or {}

    def set_server(self, config: dict, server: str = SERVER) -> None:
        """Replace the whole server (routes and error routes at once: one reload, not two)."""
        self._call("PATCH", f"/config/apps/http/servers/{server}", config)

    def upstreams(self) -> list[dict]:
        """Caddy's view of every upstream: address, requests in flight, recent fails."""
        return json.loads(self._call("GET", "/reverse_proxy/upstreams") or b"[]")

    def metrics(self) -> str:
        return self._call("GET", "/metrics").decode()


def drained(admin: CaddyAdmin, upstreams: set[str], timeout: float = 5.0) -> bool:
    """Wait until the gateway has no request in flight to ``upstreams`` (just taken out of
    its routes), at most ``timeout`` seconds: a replica is stopped only after this, so no
    request is cut off half-way."""
    deadline = time.monotonic() + timeout
    while True:
        busy = {
            u["address"]
            for u in admin.upstreams()
            if u["address"] in upstreams and u.get("num_requests", 0) > 0
        }
        if not busy:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def routed_upstreams(routes: list[dict]) -> set[str]:
    """The replica addresses a pushed route list balances over."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("handler") == "reverse_proxy" and "health_checks" in node:  # a balancer
                found.update(u["dial"] for u in node.get("upstreams", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(routes)
    return found
