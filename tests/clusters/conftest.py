"""The cluster gateway for tests: a real Caddy 2 started once per xdist worker (its own admin
and listen ports, by TEST_NAMESPACE and worker), configured as JSON over its admin API, and
Django's live server answering its forward-auth sub-requests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler import gateway as gw
from tests.marketplace.conftest import (  # noqa: F401 - fixtures used by name
    _label_test_containers,
    funded_team,
    provider_team,
)


def _worker_index() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


def _namespace() -> int:
    return int(os.environ.get("TEST_NAMESPACE", "0"))


def gateway_ports() -> tuple[int, int]:
    """(admin, listen): below the ephemeral range, apart from the simulated hosts' ports."""
    base = 29000 + _namespace() * 100 + _worker_index() * 10
    return base, base + 1


def wait_for_port(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


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
    admin_port, listen = gateway_ports()
    home = tmp_path_factory.mktemp("caddy")
    boot = home / "boot.json"
    boot.write_text(json.dumps({"admin": {"listen": f"127.0.0.1:{admin_port}"}}))
    log = home / "caddy.log"
    env = {**os.environ, "XDG_DATA_HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    process = subprocess.Popen(
        ["caddy", "run", "--config", str(boot)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_for_port(admin_port)
        admin = f"127.0.0.1:{admin_port}"
        gw.CaddyAdmin(admin).load(
            gw.gateway_config(admin=admin, listen=f"127.0.0.1:{listen}", routes=[])
        )
        wait_for_port(listen)
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
    from marketplace.clusters import auth, routes

    auth.forget()
    routes.routes_push()
    return caddy
