"""Requests through a real Caddy while its routes are pushed again and again; run alone in a
network namespace of its own (the kernel setting it is run with is that namespace's):

    unshare -n sh -c 'ip link set lo up; echo 1 > /proc/sys/net/ipv4/tcp_migrate_req;
                      python -m tests.clusters.reload_under_load'

Prints {"ok": answered 200, "failed": [each failure's status or exception name]} as JSON."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PUSHES = 80
CLIENTS = 8


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 - the standard library's name
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def _upstream() -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"127.0.0.1:{server.server_address[1]}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
    os.environ.setdefault("DEBUG", "1")
    import django

    django.setup()
    from scheduler import gateway as gw

    upstreams = [_upstream(), _upstream()]
    admin_at, listen = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    home = Path(tempfile.mkdtemp())
    boot = home / "boot.json"
    boot.write_text(json.dumps({"admin": {"listen": admin_at}}))
    env = {**os.environ, "XDG_DATA_HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    caddy = subprocess.Popen(
        ["caddy", "run", "--config", str(boot)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        admin = gw.CaddyAdmin(admin_at)
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.load(gw.gateway_config(admin=admin_at, listen=listen, routes=[]))
                break
            except gw.GatewayUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        def routes(n: int) -> list[dict]:
            route = gw.ClusterRoute(1, tuple(upstreams[: 1 + n % 2]))
            return gw.cluster_routes([route], auth_upstream="127.0.0.1:9", session_cookie="s")

        admin.set_routes(_without_auth(routes(0)))
        ok, failed, stop = [0], [], threading.Event()
        port = int(listen.rsplit(":", 1)[1])

        def client() -> None:
            while not stop.is_set():
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                try:
                    conn.request("GET", "/clusters/1/service/")
                    response = conn.getresponse()
                    response.read()
                    if response.status == 200:
                        ok[0] += 1
                    else:
                        failed.append(response.status)
                except OSError as error:
                    failed.append(type(error).__name__)
                finally:
                    conn.close()

        clients = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for thread in clients:
            thread.start()
        for n in range(1, PUSHES + 1):
            admin.set_routes(_without_auth(routes(n)))
            time.sleep(0.05)
        stop.set()
        for thread in clients:
            thread.join()
    finally:
        caddy.terminate()
        caddy.wait(timeout=10)
    print(json.dumps({"ok": ok[0], "failed": failed}))


def _without_auth(routes: list[dict]) -> list[dict]:
    """The cluster routes with the forward-auth step taken out: what is measured here is the
    reload, not the web process."""
    for route in routes:
        for sub in route["handle"]:
            for inner in sub.get("routes", []):
                inner["handle"] = [
                    h for h in inner["handle"] if "rewrite" not in h or "uri" not in h["rewrite"]
                ]
    return routes


if __name__ == "__main__":
    sys.exit(main())
