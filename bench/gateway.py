"""The cluster gateway: latency it adds (forward-auth included), what it sustains, and failed
requests during rolling updates.

Real parts: Caddy 2 (the gateway), a web process started from the recipe's unit and
environment file (uvicorn serving Django with DEBUG off: the forward-auth answer, as in
production), a simulated host running two busybox httpd replicas. Budgets (DESIGN.md):

- 200 requests/s through a cluster URL with 1,000 keys (each request the next key, so each
  key comes back only every 5 s, past the web processes' 2-s memory of an answer: the
  authentication path is measured, not a cached answer), each request paired with one
  straight to a replica at the same moment: p99 of the per-request differences ≤ 5 ms;
- 10 rolling updates of the image at 100 requests/s: 0 failed requests.

Also printed: requests/s the gateway + auth sustain with 16 clients, the load average, and
the kernel's ``net.ipv4.tcp_migrate_req`` (0: each Caddy reload may reset a connection that
was waiting to be accepted; see scheduler/gateway.py). Exits 1 when over a budget.

    .venv/bin/python bench/gateway.py
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://gpumkt:gpumkt@127.0.0.1:5432/gpumkt_bench_gw")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
os.environ["CELERY_TASK_ALWAYS_EAGER"] = "1"
os.environ["CONTAINER_EXTRA_LABELS"] = "gpumkt.bench=1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ADMIN, LISTEN, WEB = free_port(), free_port(), free_port()
os.environ["GATEWAY_ADMIN"] = f"127.0.0.1:{ADMIN}"
os.environ["GATEWAY_URL"] = f"http://127.0.0.1:{LISTEN}"
os.environ["GATEWAY_AUTH_UPSTREAM"] = f"127.0.0.1:{WEB}"
os.environ["GATEWAY_LISTEN"] = ""  # the bench loads the gateway's server itself
# What the web process must see as this process does (its pushes write the same routes).
GATEWAY_SETTINGS = ("GATEWAY_ADMIN", "GATEWAY_URL", "GATEWAY_AUTH_UPSTREAM", "GATEWAY_LISTEN")

from bench_common import budget_row, scratch_database, simulated_machine  # noqa: E402

from deploy.cluster import LocalCluster, Redis  # noqa: E402

# A private Redis, started in main(): the bench needs no server of the test suite's.
REDIS = Redis(Path(tempfile.mkdtemp(prefix="gpumkt-gateway-redis-")), persistent=False)
os.environ["REDIS_URL"] = REDIS.url

# Caddy's and the web process's output of the last run (a failed request is read there).
LOGS = Path(__file__).resolve().parents[1] / "var" / "bench"

IMAGE = "gpumkt/busybox:latest"
ROLLED = "gpumkt/busybox:bench-rolled"
SERVE = [
    "-c",
    "trap 'exit 0' TERM; mkdir -p /www; hostname > /www/index.html; httpd -f -p 8080 -h /www & wait",
]
SECONDS = 10
RATE = 200
KEYS, MEMBERS = 1000, 20
ROLLS, ROLL_RATE = 10, 100
P99_BUDGET_MS = 5.0
FAILED_BUDGET = 0


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


def one(port: int, path: str, headers: dict) -> tuple[object, float]:
    """(status, or the exception's name; ms) of one request on a new connection."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        status: object = response.status
        if status != 200:  # what answered: ours (uvicorn), Caddy's own, or a replica
            said = body[:60].decode(errors="replace").strip()
            server = f"(server: {response.getheader('Server', '-')})"
            status = " ".join(part for part in (str(status), said, server) if part)
    except OSError as error:
        status = type(error).__name__
    finally:
        conn.close()
    return status, (time.perf_counter() - started) * 1000


class Keys:
    """The next key for each request, round robin over all of them."""

    def __init__(self, secrets: list[str]):
        self._next = itertools.cycle([{"Authorization": f"Bearer {s}"} for s in secrets])
        self._lock = threading.Lock()

    def __call__(self) -> dict:
        with self._lock:
            return next(self._next)


def open_loop(rate: float, stop, work, threads: int = 8) -> list:
    """Call ``work(i)`` ``rate`` times a second over ``threads`` until ``stop()``; its
    results."""
    results: list = []
    lock = threading.Lock()
    each = rate / threads
    counter = itertools.count()

    def run(offset: float) -> None:
        next_at = time.monotonic() + offset
        while not stop():
            time.sleep(max(0.0, next_at - time.monotonic()))
            result = work(next(counter))
            with lock:
                results.append(result)
            next_at += 1 / each

    workers = [threading.Thread(target=run, args=(i / rate,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return results


def for_seconds(seconds: float):
    stop_at = time.monotonic() + seconds
    return lambda: time.monotonic() >= stop_at


def paired(direct_ports: list[int], path: str, keys: Keys, rate: float, seconds: float):
    """Each request through the gateway beside one straight to a replica, back to back (which
    goes first alternates): [(through status, direct status, through ms, direct ms)]."""

    def pair(i: int):
        direct = (direct_ports[i % len(direct_ports)], "/", {})
        through = (LISTEN, path, keys())
        if i % 2:
            d, t = one(*direct), one(*through)
        else:
            t, d = one(*through), one(*direct)
        return t[0], d[0], t[1], d[1]

    return open_loop(rate, for_seconds(seconds), pair)


def closed_loop(port: int, path: str, keys: Keys, clients: int, seconds: float) -> float:
    count = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def run() -> None:
        while time.monotonic() < stop_at:
            status, _ = one(port, path, keys())
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


def migrate_req() -> str:
    try:
        return Path("/proc/sys/net/ipv4/tcp_migrate_req").read_text().strip()
    except OSError:
        return "unknown"


def tenant_keys(team, count: int, members: int) -> list[str]:
    """``count`` renter keys of the team, made by ``members`` admins of it."""
    from marketplace.models import Membership, Role, User
    from marketplace.services.accounts import api_key_create

    secrets = []
    for m in range(members):
        user = User.objects.create_user(f"bench-member-{m}", f"bm{m}@example.com", "x")
        membership = Membership.objects.create(team=team, user=user, role=Role.ADMIN)
        for k in range(count // members):
            secrets.append(api_key_create(membership=membership, name=f"k{k}").secret)
    return secrets


def rolled(cluster, image: str, timeout: float = 90) -> None:
    """Push the routes (as the worker's retries would) until both replicas run ``image`` and
    the gateway routes exactly them."""
    from marketplace.clusters import routes
    from scheduler import gateway

    admin = gateway.CaddyAdmin(f"127.0.0.1:{ADMIN}")
    deadline = time.monotonic() + timeout
    while True:
        routes.routes_push()
        running = cluster.deployment.replicas.filter(state="running").select_related("instance")
        images = [r.instance.image for r in running]
        where = set(gateway.replica_upstreams([r.instance_id for r in running], 8080).values())
        if images == [image] * 2 and gateway.routed_upstreams(admin.routes()) == where:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not rolled to {image}: running {images}")
        time.sleep(0.2)


def web_process(scratch: Path):
    """One web process as ``gpumkt-web@.service`` runs it, with the recipe's environment file
    (DEBUG off, JSON logs) pointed at this bench's database, Redis and gateway."""
    recipe = LocalCluster(
        scratch, database_url=os.environ["DATABASE_URL"], redis_url=os.environ["REDIS_URL"],
        webs=0, workers=0,
        overrides={"ALLOWED_HOSTS": "localhost,127.0.0.1",
                   **{name: os.environ.get(name, "") for name in GATEWAY_SETTINGS}},
    )  # fmt: skip
    return recipe.start_web(WEB)


@contextlib.contextmanager
def stopped_at_exit(redis: Redis):
    try:
        yield redis
    finally:
        redis.stop()


def gateway_holds(admin, secrets: list[str], timeout: float = 30) -> None:
    """Wait until the gateway's remembered keys (its fallback, pushed by the web process a
    moment after it first lets a key through) hold every key, so that the reloads those
    pushes cause happen before what is measured, not in it."""
    deadline = time.monotonic() + timeout
    while True:
        held = json.dumps(admin.server())
        if all(secret in held for secret in secrets):
            return
        if time.monotonic() > deadline:
            raise AssertionError("the gateway does not remember every key")
        time.sleep(0.2)


def main() -> int:
    if shutil.which("caddy") is None:
        sys.exit("needs Caddy 2: apt-get install caddy")
    LOGS.mkdir(parents=True, exist_ok=True)
    REDIS.start()
    with (
        stopped_at_exit(REDIS),
        scratch_database(),
        simulated_machine(gpus=4),
        tempfile.TemporaryDirectory() as tmp,
        open(LOGS / "gateway-caddy.log", "wb") as caddy_log,
    ):
        from billing.credits import credit_grant
        from marketplace.clusters.services import ClusterSpec, cluster_create, cluster_update
        from marketplace.models import Membership, Role, Team, User
        from scheduler import gateway

        user = User.objects.create_user("bench-renter", "br@example.com", "x")
        team = Team.objects.create(name="bench renter")
        Membership.objects.create(team=team, user=user, role=Role.OWNER)
        credit_grant(team_id=team.pk, amount=10**10, reason="bench", idempotency_key="bench")
        secrets = tenant_keys(team, KEYS, MEMBERS)
        keys = Keys(secrets)

        env = {**os.environ, "XDG_DATA_HOME": tmp, "XDG_CONFIG_HOME": tmp}
        boot = Path(tmp) / "boot.json"
        boot.write_text(json.dumps({"admin": {"listen": f"127.0.0.1:{ADMIN}"}}))
        caddy = subprocess.Popen(
            ["caddy", "run", "--config", str(boot)], env=env, stdout=caddy_log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        web = None
        try:
            web = web_process(Path(tmp) / "recipe")
            wait_for(ADMIN)
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
            rolled(cluster, IMAGE, timeout=30)
            path = f"/clusters/{cluster.pk}/service/"
            direct_ports = [
                int(u.rsplit(":", 1)[1]) for u in gateway.routed_upstreams(admin.routes())
            ]
            # Warm up: every key once (the web process looks each up and the gateway's
            # fallback learns it: those pushes happen here, not in what is measured).
            for _ in range(KEYS // 100):
                paired(direct_ports, path, keys, 100, 1)
            gateway_holds(admin, secrets)

            pairs = paired(direct_ports, path, keys, RATE, SECONDS)
            bad_pairs = [p for p in pairs if p[0] != 200 or p[1] != 200]
            diffs = [t - d for _, _, t, d in pairs]
            through = [t for _, _, t, _ in pairs]
            direct = [d for _, _, _, d in pairs]
            sustained = closed_loop(LISTEN, path, keys, clients=16, seconds=5)

            subprocess.run(["docker", "tag", IMAGE, ROLLED], check=True, capture_output=True)
            done = threading.Event()
            results: list = []
            load = threading.Thread(
                target=lambda: results.extend(
                    open_loop(ROLL_RATE, done.is_set, lambda i: one(LISTEN, path, keys())[0])
                )
            )
            load.start()
            roll_seconds = []
            try:
                for n in range(ROLLS):
                    image = ROLLED if n % 2 == 0 else IMAGE
                    started = time.monotonic()
                    cluster.refresh_from_db()
                    cluster_update(cluster=cluster, changes={"image": image})
                    rolled(cluster, image)
                    roll_seconds.append(time.monotonic() - started)
            finally:
                done.set()
                load.join()
            failed = [s for s in results if s != 200]
        finally:
            caddy.terminate()
            caddy.wait(timeout=10)
            if web is not None:
                web.stop(timeout=10)
                shutil.copyfile(web.log, LOGS / "gateway-web.log")

    load_avg = os.getloadavg()
    print(
        f"cluster gateway (Caddy 2 + forward-auth to Django under uvicorn), load average "
        f"{load_avg[0]:.1f} / {load_avg[1]:.1f} / {load_avg[2]:.1f} on {os.cpu_count()} cores, "
        f"net.ipv4.tcp_migrate_req={migrate_req()}:"
    )
    print(f"  {SECONDS} s at {RATE} requests/s, {KEYS:,} keys ({MEMBERS} members' keys, each"
          f" request the next one), each beside a request straight to a replica:")  # fmt: skip
    for name, values in (("direct to a replica", direct), ("through the gateway", through)):
        print(f"  {name:24} p50 {pct(values, 0.5):6.2f} ms   p99 {pct(values, 0.99):6.2f} ms")
    p99 = pct(diffs, 0.99)
    print(
        f"  added, per request       p50 {pct(diffs, 0.5):6.2f} ms   p90 {pct(diffs, 0.9):6.2f} ms"
        f"   p99 {p99:6.2f} ms   budget p99 ≤ {P99_BUDGET_MS:g} ms   ratio {p99 / P99_BUDGET_MS:.2f}"
        + (f"   ({len(bad_pairs)} pairs not 200)" if bad_pairs else "")
    )
    print(f"  sustained, 16 clients    {sustained:6.0f} requests/s through the gateway + auth")
    print(
        f"  {ROLLS} rolling updates of the image at {ROLL_RATE} requests/s: {len(failed)} of"
        f" {len(results)} failed   budget {FAILED_BUDGET}"
        f"   (a roll took {min(roll_seconds):.1f}–{max(roll_seconds):.1f} s)"
        + (f"; {dict(Counter(map(str, failed)))}" if failed else "")
    )
    if failed:
        print(f"  Caddy's and the web process's logs of this run: {LOGS}/gateway-*.log")
    ok = p99 <= P99_BUDGET_MS and len(failed) <= FAILED_BUDGET and not bad_pairs
    budget_row(
        "gateway.py", budget=f"added latency p99 ≤ {P99_BUDGET_MS:g} ms at {RATE} requests/s, {KEYS:,} keys",
        figure=f"p99 {p99:.2f} ms (p50 {pct(diffs, 0.5):.2f} ms)"
        + (f", {len(bad_pairs)} pairs not 200" if bad_pairs else ""),
        floor=f"straight to a replica: p50 {pct(direct, 0.5):.2f} ms, p99 {pct(direct, 0.99):.2f} ms",
        ratio=p99 / P99_BUDGET_MS, within=p99 <= P99_BUDGET_MS and not bad_pairs,
    )  # fmt: skip
    budget_row(
        "gateway.py", budget=f"0 failed requests in {ROLLS} rolling updates at {ROLL_RATE} requests/s",
        figure=f"{len(failed)} of {len(results):,} failed", within=len(failed) <= FAILED_BUDGET,
    )  # fmt: skip
    print("  within budget" if ok else "  OVER BUDGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
