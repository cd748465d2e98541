"""The cluster routes go in front of a site that Caddy already serves, as behind the
production Caddyfile (one site proxying to the web processes, server ``srv0``): the site keeps
answering, the cluster URLs are added before it and moved with each push, and the site's own
route is never touched."""

from __future__ import annotations

import json
import subprocess

import pytest

from marketplace.clusters import routes
from marketplace.clusters.services import ClusterSpec, cluster_create, cluster_delete
from marketplace.services.accounts import api_key_create
from scheduler import gateway as gw
from tests.clusters.support import call

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_cluster_routes_go_in_front_of_the_sites_own(caddy, live_server, settings, funded_team):
    site = live_server.url.removeprefix("http://")
    caddyfile = (
        f"{{\n\tadmin {caddy.admin}\n}}\n\n"
        f"http://127.0.0.1:{caddy.listen} {{\n\treverse_proxy {site}\n}}\n"
    )
    adapted = subprocess.run(
        ["caddy", "adapt", "--adapter", "caddyfile", "--config", "/dev/stdin"],
        input=caddyfile, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    admin = gw.CaddyAdmin(caddy.admin)
    admin.load(json.loads(adapted))
    try:
        settings.GATEWAY_ADMIN = caddy.admin
        settings.GATEWAY_SERVER = "srv0"
        settings.GATEWAY_AUTH_UPSTREAM = site
        site_route = admin.routes("srv0")
        # A Caddyfile cannot say "do not save the config" in Caddy 2.6: the first push does,
        # before any remembered API key can reach Caddy's config (and its autosave file).
        assert json.loads(admin._call("GET", "/config/admin")).get("config") is None
        # A cluster whose replicas wait: its URL answers its team 503 and anyone else 401.
        cluster = cluster_create(
            team=funded_team,
            spec=ClusterSpec(name="svc", image="busybox", gpu_names=["None"], service_port=80),
        )
        routes.routes_push()
        assert json.loads(admin._call("GET", "/config/admin/config")) == {"persist": False}
        path = f"/clusters/{cluster.pk}/service/"
        owner = funded_team.memberships.get()
        secret = api_key_create(membership=owner, name="svc", access="read").secret
        key = {"Authorization": f"Bearer {secret}"}
        assert call(caddy.listen, path, key)[0] == 503
        assert call(caddy.listen, path)[0] == 401
        assert call(caddy.listen, "/healthz")[0] == 200  # the site, through its own route
        assert admin.routes("srv0")[-len(site_route) :] == site_route

        # Pushed again (the cluster gone): ours replaced, the site's route as it was.
        cluster_delete(cluster=cluster)
        routes.routes_push()
        assert call(caddy.listen, path, key)[0] == 401
        assert call(caddy.listen, "/healthz")[0] == 200
        now = admin.routes("srv0")
        assert [r for r in now if not gw.is_cluster_route(r)] == site_route
        assert [r.get("@id") for r in now if gw.is_cluster_route(r)] == [gw.OTHER_CLUSTERS]
    finally:  # the worker's gateway as the other tests expect it
        admin.load(
            gw.gateway_config(admin=caddy.admin, listen=f"127.0.0.1:{caddy.listen}", routes=[])
        )
