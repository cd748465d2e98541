"""Committed rentals per second: 8 API clients over 2 web processes on PostgreSQL.

Two web processes are started from the production recipe's unit (deploy/, uvicorn) on a
scratch PostgreSQL database and a private Redis. The database holds 200 machines of 8 GPUs
each (listed, online, with their offers, as ``offer_refresh`` would compute them; no host is
reached: renting commits before any launch, which a worker does after commit) and 8 renter
teams with credit and a write API key each. Eight client threads, four on each web process,
each on one keep-alive connection, rent 1 GPU of a random machine (``POST /api/v1/instances/``)
as fast as they are answered, for ``--seconds``. A refusal because another client took the
machine's last GPU first (409) is counted, not failed. The launch tasks the rentals queue wait
in Redis (no worker runs).

Afterwards: no GPU has two live allocations, and billing's ledger check finds nothing wrong.
It also prints the CPU each rent request cost the web processes, PostgreSQL (the bench database's
backends), Redis and the clients (from /proc): on a machine shared with other work the rate
follows the load, the CPU per request does not, and two cores give at most 2,000 ms of it a
second.

Budget (DESIGN.md): ≥ 200 committed rentals/s, 0 double allocations.

    .venv/bin/python bench/rent_throughput.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import (  # noqa: E402
    private_redis,
    process_cpu_seconds,
    scratch_database,
    web_bench_environment,
    web_processes,
)

REDIS = web_bench_environment("rent")

BUDGET = 200.0
MACHINES, GPUS_EACH, CLIENTS = 200, 8, 8


def populate() -> tuple[list[int], list[str]]:
    from django.db import transaction

    from billing.credits import credit_grant
    from hosts.models import Gpu, Machine
    from marketplace.models import Membership, Offer, Role, Team, User
    from marketplace.services.accounts import api_key_create
    from marketplace.services.offers import offer_score

    provider = Team.objects.create(name="bench provider")
    with transaction.atomic():
        machines = Machine.objects.bulk_create(
            Machine(
                team=provider, name=f"m{i}", address=f"10.9.{i // 256}.{i % 256}", status="online",
                listed=True, price_per_gpu_hour=400_000, storage_price_per_gb_month=100_000,
                location="US", cpu_cores=128, ram_mb=512_000, disk_free_gb=4000,
                reliability=0.99, driver_version="550.54.14", cuda_version="12.4",
            )
            for i in range(MACHINES)
        )  # fmt: skip
        Gpu.objects.bulk_create(
            Gpu(machine=m, index=n, uuid=f"GPU-{m.pk}-{n}", name="NVIDIA GeForce RTX 4090", memory_mib=24_564)
            for m in machines
            for n in range(GPUS_EACH)
        )  # fmt: skip
        Offer.objects.bulk_create(
            Offer(
                machine=m, provider_team=provider, rentable=True, gpu_name="RTX 4090",
                num_gpus=GPUS_EACH, total_gpus=GPUS_EACH, min_gpus=1, gpu_ram=24.0,
                cpu_cores_per_unit=16, cpu_ram_per_unit=62.5, disk_per_unit=500.0,
                price_per_gpu_hour=400_000, dph_total=400_000 * GPUS_EACH, storage_cost=100_000,
                reliability=0.99, geolocation="US", driver_version="550.54.14", cuda_max_good=12.4,
                verified=False,
                score=offer_score(reliability=0.99, gpu_total_ram_gb=24.0 * GPUS_EACH, dph_total=400_000 * GPUS_EACH),
            )
            for m in machines
        )  # fmt: skip
    keys = []
    for number in range(CLIENTS):
        user = User.objects.create_user(
            username=f"renter{number}", email=f"renter{number}@bench.invalid", password=None
        )
        membership = Membership.objects.filter(user=user, team__personal=True).first()
        if membership is None:
            team = Team.objects.create(name=f"renter {number}", personal=True)
            membership = Membership.objects.create(team=team, user=user, role=Role.OWNER)
        credit_grant(
            team_id=membership.team_id, amount=1_000_000 * 1_000_000, reason="bench",
            idempotency_key=f"bench-rent-{number}",
        )  # fmt: skip
        keys.append(api_key_create(membership=membership, name="bench", access="write").secret)
    return [m.pk for m in machines], keys


def client(port: int, key: str, machines: list[int], stop: threading.Event, tally: dict) -> None:
    rng = random.Random()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {
        "Authorization": f"Bearer {key}", "Content-Type": "application/json", "Host": "localhost",
    }  # fmt: skip
    while not stop.is_set():
        body = json.dumps(
            {"machine_id": rng.choice(machines), "num_gpus": 1, "image": "gpumkt/busybox:latest",
             "duration_hours": 1}
        )  # fmt: skip
        connection.request("POST", "/api/v1/instances/", body=body, headers=headers)
        response = connection.getresponse()
        answer = response.read()
        if response.status == 201:
            tally["rented"] += 1
        elif response.status == 409:
            tally["refused"] += 1
        else:
            tally["failed"] += 1
            tally.setdefault("errors", []).append(f"{response.status} {answer[:200]!r}")
    connection.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (0 once it is gone)."""
    return process_cpu_seconds(pid) or 0.0


def with_children(pid: int) -> list[int]:
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            pids += with_children(int(child))
    return pids


def cpu_now(cluster) -> dict[str, float]:
    """CPU seconds so far of the web processes, this database's backends, Redis, and us."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        backends = {f"postgres:{pid}": cpu_seconds(pid) for (pid,) in cursor.fetchall()}
    own = os.times()
    return {
        "web": sum(cpu_seconds(p) for web in cluster.webs for p in with_children(web.popen.pid)),
        "redis": cpu_seconds(REDIS.popen.pid),
        "clients": own.user + own.system,
        **backends,
    }


def cpu_per_request(before: dict[str, float], after: dict[str, float], requests: int) -> str:
    spent = {key: after[key] - before.get(key, 0.0) for key in after}
    postgres = sum(v for key, v in spent.items() if key.startswith("postgres:"))
    parts = {"web": spent["web"], "PostgreSQL": postgres, "Redis": spent["redis"]}
    parts["clients"] = spent["clients"]
    each = {name: seconds * 1000 / max(requests, 1) for name, seconds in parts.items()}
    listed = ", ".join(f"{name} {ms:.1f}" for name, ms in each.items())
    return f"CPU per rent request (ms): {listed}; {sum(each.values()):.1f} in all"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=CLIENTS, help="API clients (budget: 8)")
    with private_redis(REDIS), scratch_database():
        run(parser.parse_args())


def run(args) -> None:
    from django.db import connection

    from billing.selectors import ledger_problems

    machines, keys = populate()
    with web_processes(REDIS, overrides={"API_THROTTLE_WRITE": "10000000/min"}) as cluster:
        stop = threading.Event()
        tallies = [{"rented": 0, "refused": 0, "failed": 0} for _ in range(args.clients)]
        threads = [
            threading.Thread(
                target=client,
                args=(cluster.web_ports[n % 2], keys[n], machines, stop, tallies[n]),
            )
            for n in range(args.clients)
        ]
        print(f"renting for {args.seconds:g} s …", flush=True)
        cpu_before = cpu_now(cluster)
        started = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(args.seconds)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        elapsed = time.monotonic() - started
        cpu_after = cpu_now(cluster)
    rented = sum(t["rented"] for t in tallies)
    refused = sum(t["refused"] for t in tallies)
    failed = sum(t["failed"] for t in tallies)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) - count(DISTINCT gpu_id) FROM scheduler_gpuallocation"
            " WHERE released_at IS NULL"
        )
        (doubled,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM marketplace_rental")
        (rentals,) = cursor.fetchone()
    problems = ledger_problems()
    rate = rented / elapsed
    load = os.getloadavg()[0]
    print(
        f"{args.clients} clients over 2 web processes, {args.seconds:g} s: {rented} rentals committed "
        f"({rentals} in the database), {refused} refused (409: taken), {failed} failed; "
        f"{rate:.0f} rentals/s; double allocations {doubled}; ledger "
        f"{'; '.join(problems) or 'consistent'} (load average {load:.2f})"
    )
    print(cpu_per_request(cpu_before, cpu_after, rented + refused + failed))
    for error in [e for t in tallies for e in t.get("errors", [])][:5]:
        print("  failed:", error)
    print(f"budget ≥ {BUDGET:.0f} rentals/s, 0 double allocations: {rate / BUDGET:.2f}× the budget")
    if rate < BUDGET or doubled or failed or problems or rentals != rented:
        sys.exit(1)


if __name__ == "__main__":
    main()
