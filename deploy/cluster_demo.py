"""``make cluster-demo``: a whole installation on this machine, from the production recipe.

Starts two simulated 4-GPU hosts, a private PostgreSQL and Redis, then the recipe's units:
two web processes behind Caddy (TLS for ``localhost`` from Caddy's own CA), three Celery
workers and beat. Eight renters then race through Caddy for the 8 GPUs (2 at a time), and the
demo prints who got what, which web process served each request, and the checks: no GPU
twice, the ledger consistent. It keeps running until Ctrl-C, printing the address, a renter's
API key and where the logs are. Needs root (sshd, Docker), as ``make run``'s hosts do.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from deploy.cluster import ROOT, LocalCluster, Postgres, Redis

RENTERS = 8
QUICK_STOP = ["-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]


def sim_hosts(folder: Path) -> list:
    from hosts.devtools.sim_docker import ensure_dockerd, ensure_image
    from hosts.devtools.simulation import SimHostSpec, create_host, default_gpus

    ensure_dockerd(log_path=folder / "dockerd.log")
    ensure_image()
    hosts = []
    for i in range(2):
        spec = SimHostSpec(
            name=f"cluster-demo-{i}",
            address=f"127.0.0.{60 + i}",
            port=2261 + i,
            gpus=default_gpus(4),
            port_range=(26000 + 100 * i, 26099 + 100 * i),
        )
        hosts.append(create_host(folder / spec.name, spec))
    return hosts


def race(cluster: LocalCluster, accounts: dict) -> list[tuple[str, int, str]]:
    machines = accounts["machines"]
    barrier = threading.Barrier(len(accounts["renters"]))
    answers: list[tuple[str, int, str]] = []

    def renter(number: int, who: dict) -> None:
        barrier.wait()
        for step in range(2):
            body = {
                "machine_id": machines[(number + step) % 2], "num_gpus": 2,
                "image": "gpumkt/busybox:latest", "duration_hours": 1, "entrypoint": "sh",
                "args": QUICK_STOP,
            }  # fmt: skip
            status, answer = cluster.api("POST", "/instances/", who["key"], body)
            said = f"instance {answer['id']}" if status == 201 else answer["error"]["message"]
            answers.append((who["user"], status, said))

    threads = [
        threading.Thread(target=renter, args=(n, r)) for n, r in enumerate(accounts["renters"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("cluster-demo needs root: the simulated hosts run sshd and Docker")
    folder = ROOT / "var" / "cluster-demo"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print("==> simulated hosts, PostgreSQL, Redis")
    hosts = sim_hosts(folder / "hosts")
    postgres = Postgres().start()
    redis = Redis(folder / "redis").start()
    cluster = LocalCluster(
        folder / "cluster",
        database_url=postgres.url,
        redis_url=redis.url,
        webs=2,
        workers=3,
        overrides={
            "HOST_ALLOW_LOOPBACK": "1",
            "HOST_SELFTEST_IMAGE": "gpumkt/busybox:latest",
            "CONTAINER_EXTRA_LABELS": "gpumkt.cluster-demo=1",
        },
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        print(
            "==> the recipe's units: 2 web, 3 workers, beat, Caddy (deploy/systemd, deploy/Caddyfile)"
        )
        cluster.start()
        (folder / "hosts.json").write_text(json.dumps([h.to_dict() for h in hosts]))
        out = cluster.manage(
            "shell", "-c",
            f"from deploy.demo_accounts import populate; populate({str(folder / 'hosts.json')!r})",
        )  # fmt: skip
        accounts = json.loads(out.strip().splitlines()[-1])
        print(f"==> {RENTERS} renters race through Caddy for 8 GPUs, 2 at a time")
        for user, status, said in sorted(race(cluster, accounts)):
            print(f"  {user:<18} {status}  {said}")
        served = Counter()
        for web in cluster.webs:
            served[web.name] = web.tail(50_000_000).count("POST /api/v1/instances/")
        print("  served by: " + ", ".join(f"{name} {count}" for name, count in served.items()))
        checked = cluster.manage(
            "shell", "-c",
            "from scheduler.models import GpuAllocation\n"
            "from billing.selectors import ledger_problems\n"
            "live = list(GpuAllocation.objects.filter(released_at=None).values_list('gpu_id', flat=True))\n"
            "problems = ledger_problems()\n"
            "print(f'{len(live)} GPUs allocated, {len(set(live))} distinct; ledger: '"
            " + ('; '.join(problems) or 'consistent'))",
        )  # fmt: skip
        print("  " + checked.strip().splitlines()[-1])
        renter = accounts["renters"][0]
        print(
            f"""
  The installation is running:  {cluster.front}/  (Caddy, TLS from its own CA:
    {cluster.scratch / "caddy-data/caddy/pki/authorities/local/root.crt"})
  web processes: {", ".join(f"127.0.0.1:{p}" for p in cluster.web_ports)}   metrics token: {cluster.env["METRICS_TOKEN"]}
  a renter's API key: {renter["key"]}
    curl --cacert …/root.crt -H "Authorization: Bearer {renter["key"]}" {cluster.front}/api/v1/instances/
  logs: {cluster.scratch / "logs"}/
  Press Ctrl-C to stop."""
        )
        while not stopping.is_set():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        print("\n==> stopping")
        cluster.stop()
        redis.stop()
        postgres.remove()
        for host in hosts:
            host.stop()
        ids = subprocess.run(
            ["docker", "ps", "-aq", "--filter", "label=gpumkt.cluster-demo=1"],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)


if __name__ == "__main__":
    main()
