"""The cluster gateway for tests: a real Caddy 2 started once per xdist worker (its admin and
listen ports handed out by the OS: tests/ports.py), configured as JSON over its admin API, and
Django's live server answering its forward-auth sub-requests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler import gateway as gw
from tests.marketplace.conftest import (  # noqa: F401 - fixtures used by name
    _label_test_containers,
    funded_team,
    machine_for,
    provider_team,
)
from tests.ports import bind_a_free_port, serve_on_a_free_port


@dataclass
class Caddy:
    admin: str
    listen: int
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen}"


@pytest.fixture(scope="session")
def caddy(tmp_path_factory) -> Caddy:
    """Caddy 2 from Debian, run as a plain process (no systemd)."""
    if shutil.which("caddy") is None:
        pytest.fail("the cluster gateway tests need Caddy 2 (apt-get install caddy)")
    home = tmp_path_factory.mktemp("caddy")
    log = home / "caddy.log"
    env = {**os.environ, "XDG_DATA_HOME": str(home), "XDG_CONFIG_HOME": str(home)}

    def start(admin_port: int) -> subprocess.Popen:
        boot = home / "boot.json"
        boot.write_text(json.dumps({"admin": {"listen": f"127.0.0.1:{admin_port}"}}))
        return subprocess.Popen(
            ["caddy", "run", "--config", str(boot)],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env=env,
        )

    process, admin_port = serve_on_a_free_port(start)
    try:
        admin = f"127.0.0.1:{admin_port}"

        def listen_on(port: int) -> None:
            gw.CaddyAdmin(admin).load(
                gw.gateway_config(admin=admin, listen=f"127.0.0.1:{port}", routes=[])
            )

        listen = bind_a_free_port(process.pid, listen_on)
        yield Caddy(admin=admin, listen=listen, process=process, log=log)
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def gateway(caddy, live_server, settings) -> Caddy:
    """The gateway pointed at this test's live server, with no cluster routes yet."""
    settings.GATEWAY_ADMIN = caddy.admin
    settings.GATEWAY_URL = caddy.url
    settings.GATEWAY_AUTH_UPSTREAM = live_server.url.removeprefix("http://")
    from marketplace.clusters import auth, remembered, routes

    auth.forget()
    remembered.forget()
    routes.routes_push()
    return caddy


@pytest.fixture(scope="session")
def cluster_hosts(sim_host_factory):
    """Three 2-GPU simulated hosts shared by the tests here (each lists its own machines)."""
    return [sim_host_factory(gpus=2) for _ in range(3)]


@pytest.fixture
def machines(cluster_hosts, provider_team):  # noqa: F811 - the fixture imported above
    return [machine_for(host, provider_team) for host in cluster_hosts]
