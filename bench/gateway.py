"""The cluster gateway: latency it adds (forward-auth included), what it sustains, and failed
requests during a rolling update.

Real parts: Caddy 2 (the gateway), uvicorn serving Django (the forward-auth answer, as in
production), a simulated host running two busybox httpd replicas. Budgets (DESIGN.md):

- at 200 requests/s, p99 through the gateway minus p99 calling a replica directly ≤ 5 ms;
- failed requests during a rolling update of the image at 100 requests/s: 0.

Also printed: requests/s the gateway + auth sustain with 16 clients on this machine.

    .venv/bin/python bench/gateway.py
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://gpumkt:gpumkt@127.0.0.1:5432/gpumkt_bench_gw")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6391/14")
os.environ["CELERY_TASK_ALWAYS_EAGER"] = "1"
os.environ["CONTAINER_EXTRA_LABELS"] = "gpumkt.bench=1"
ADMIN, LISTEN, WEB = 29981, 29982, 29983
os.environ["GATEWAY_ADMIN"] = f"127.0.0.1:{ADMIN}"
os.environ["GATEWAY_URL"] = f"http://127.0.0.1:{LISTEN}"
os.environ["GATEWAY_AUTH_UPSTREAM"] = f"127.0.0.1:{WEB}"

from bench_common import scratch_database, simulated_machine  # noqa: E402

IMAGE = "gpumkt/busybox:latest"
ROLLED = "gpumkt/busybox:bench-rolled"
SERVE = [
    "-c",
    "trap 'exit 0' TERM; mkdir -p /www; hostname > /www/index.html; httpd -f -p 8080 -h /www & wait",
]
SECONDS = 10
P99_BUDGET_MS = 5.0


def wait_for(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def one(port: int, path: str, headers: dict) -> tuple[int, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        status = response.status
    except OSError:
        status = 0
    finally:
        conn.close()
    return status, (time.perf_counter() - started) * 1000


def steady(port: int, path: str, headers: dict, rate: float, seconds: float, threads: int = 8):
    """Open loop: ``rate`` requests/s spread over ``threads``; (status, ms) of each."""
    results: list[tuple[int, float]] = []
    lock = threading.Lock()
    each = rate / threads
    stop_at = time.monotonic() + seconds

    def run(offset: float) -> None:
        next_at = time.monotonic() + offset
        while next_at < stop_at:
            time.sleep(max(0.0, next_at - time.monotonic()))
            result = one(port, path, headers)
            with lock:
                results.append(result)
            next_at += 1 / each

    workers = [threading.Thread(target=run, args=(i / rate,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return results


def closed_loop(port: int, path: str, headers: dict, clients: int, seconds: float) -> float:
    count = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def run() -> None:
        while time.monotonic() < stop_at:
            status, _ = one(port, path, headers)
            if status == 200:
                with lock:
                    count[0] += 1

    workers = [threading.Thread(target=run) for _ in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return count[0] / seconds


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    if shutil.which("caddy") is None:
        sys.exit("needs Caddy 2: apt-get install caddy")
    with (
        scratch_database(),
        simulated_machine(gpus=4),
        tempfile.TemporaryDirectory() as tmp,
    ):
        from billing.credits import credit_grant
        from marketplace.clusters import routes
        from marketplace.clusters.services import ClusterSpec, cluster_create, cluster_update
        from marketplace.models import Membership, Role, Team, User
        from marketplace.services.accounts import api_key_create
        from scheduler import gateway

        user = User.objects.create_user("bench-renter", "br@example.com", "x")
        team = Team.objects.create(name="bench renter", personal=True)
        membership = Membership.objects.create(team=team, user=user, role=Role.OWNER)
        credit_grant(team_id=team.pk, amount=10**10, reason="bench", idempotency_key="bench")
        secret = api_key_create(membership=membership, name="bench", access="read").secret
        key = {"Authorization": f"Bearer {secret}"}

        env = {**os.environ, "XDG_DATA_HOME": tmp, "XDG_CONFIG_HOME": tmp}
        boot = Path(tmp) / "boot.json"
        boot.write_text(json.dumps({"admin": {"listen": f"127.0.0.1:{ADMIN}"}}))
        processes = [
            subprocess.Popen(["caddy", "run", "--config", str(boot)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            subprocess.Popen([sys.executable, "-m", "uvicorn", "marketplace.asgi:application",
                              "--port", str(WEB), "--log-level", "warning", "--no-access-log"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        ]  # fmt: skip
        try:
            wait_for(ADMIN)
            wait_for(WEB)
            admin = gateway.CaddyAdmin(f"127.0.0.1:{ADMIN}")
            admin.load(
                gateway.gateway_config(
                    admin=f"127.0.0.1:{ADMIN}", listen=f"127.0.0.1:{LISTEN}", routes=[]
                )
            )
            cluster = cluster_create(
                team=team,
                spec=ClusterSpec(name="bench", image=IMAGE, entrypoint="sh", args=SERVE,
                                 replicas=2, disk_gb=1, service_port=8080),
            )  # fmt: skip
            deadline = time.monotonic() + 30
            while len(gateway.routed_upstreams(admin.routes())) < 2:
                assert time.monotonic() < deadline, "replicas never joined the gateway"
                routes.routes_push()
                time.sleep(0.2)
            path = f"/clusters/{cluster.pk}/service/"
            upstream = sorted(gateway.routed_upstreams(admin.routes()))[0]
            direct_port = int(upstream.rsplit(":", 1)[1])
            steady(LISTEN, path, key, 50, 2)  # warm up: connections, caches

            # Both at once, interleaved: the machine's other load falls on both alike.
            runs: dict[str, list] = {}
            pair = [
                threading.Thread(
                    target=lambda: runs.setdefault(
                        "direct", steady(direct_port, "/", {}, 200, SECONDS)
                    )
                ),
                threading.Thread(
                    target=lambda: runs.setdefault(
                        "through", steady(LISTEN, path, key, 200, SECONDS)
                    )
                ),
            ]
            for thread in pair:
                thread.start()
            for thread in pair:
                thread.join()
            direct, through = runs["direct"], runs["through"]
            assert all(s == 200 for s, _ in direct + through), "a request failed"
            d = [ms for _, ms in direct]
            g = [ms for _, ms in through]
            p50 = statistics.median(g) - statistics.median(d)
            p99 = pct(g, 0.99) - pct(d, 0.99)
            sustained = closed_loop(LISTEN, path, key, clients=16, seconds=5)

            subprocess.run(["docker", "tag", IMAGE, ROLLED], check=True, capture_output=True)
            results: list = []
            load = threading.Thread(
                target=lambda: results.extend(steady(LISTEN, path, key, 100, 12))
            )
            load.start()
            time.sleep(2)
            cluster_update(cluster=cluster, changes={"image": ROLLED})
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:  # the worker's retries, until both are routed
                routes.routes_push()
                time.sleep(0.5)
            load.join()
            failed = sum(1 for s, _ in results if s != 200)
            failures = sorted({s for s, _ in results if s != 200})
            rolled = cluster.deployment.replicas.filter(
                state="running", instance__image=ROLLED
            ).count()
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=10)

    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    print(f"cluster gateway (Caddy 2 + forward-auth to Django under uvicorn), {load}:")
    print(f"  {SECONDS} s at 200 requests/s each way, side by side:")
    print(
        f"  direct to a replica      p50 {statistics.median(d):6.2f} ms   p99 {pct(d, 0.99):6.2f} ms"
    )
    print(
        f"  through the gateway      p50 {statistics.median(g):6.2f} ms   p99 {pct(g, 0.99):6.2f} ms"
    )
    print(
        f"  added by the gateway     p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   "
        f"budget p99 ≤ {P99_BUDGET_MS:g} ms   ratio {p99 / P99_BUDGET_MS:.2f}"
    )
    print(f"  sustained, 16 clients    {sustained:6.0f} requests/s through the gateway + auth")
    print(
        f"  rolling update of the image at 100 requests/s: {failed} of {len(results)} failed"
        f"   budget 0   ({rolled} of 2 replicas rolled)"
        + (f"; statuses {failures}" if failed else "")
    )
    ok = p99 <= P99_BUDGET_MS and failed == 0
    print("  within budget" if ok else "  OVER BUDGET")


if __name__ == "__main__":
    main()
