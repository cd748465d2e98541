"""Shared set-up for benches: a scratch PostgreSQL database (a copy of the migrated template,
core/migrated_template.py), dropped afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg


def _unwind_on_sigterm() -> None:
    """A bench ended by SIGTERM (``timeout``, a CI runner, ``kill``) unwinds as on Ctrl-C: its
    ``finally`` blocks stop the web processes, workers and Redis it started and drop its
    database. Python's default for SIGTERM ends the process on the spot, which left them all
    running: on 2026-12-07 eight killed runs' clusters, 40 processes, ran for two hours beside
    every bench after them, their pools reconnecting to the scratch database."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


_unwind_on_sigterm()


@contextlib.contextmanager
def scratch_database(*, keep: bool = False) -> Iterator[bool]:
    """Create the database named in DATABASE_URL, set Django up on it, drop it at the end.

    With ``keep`` an existing database of that name is used as it is (migrated) and none is
    dropped at the end, so a bench that seeds for minutes can measure the same data again;
    yields whether the database already existed."""
    import dj_database_url

    config = dj_database_url.parse(os.environ["DATABASE_URL"])
    name = config["NAME"]
    admin = psycopg.connect(
        host=config["HOST"], port=config["PORT"] or 5432, user=config["USER"],
        password=config["PASSWORD"], dbname="postgres", autocommit=True,
    )  # fmt: skip
    with admin:
        existed = bool(
            admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        )
        if not (keep and existed):
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    try:
        import django

        django.setup()
        from django.core.management import call_command

        from core import migrated_template

        if not (keep and existed):
            # A copy of the migrated template (made once for all the benches), not a
            # migration from empty for each: 20 s of a core less a bench.
            template = (
                migrated_template.template_ensure(config, base="gpumkt_bench")
                if migrated_template.enabled()
                else None
            )
            migrated_template.database_create(config, name, template)
        call_command("migrate", verbosity=0)  # up to date on a copy
        yield keep and existed
    finally:
        from django.db import connections

        connections.close_all()
        if not keep:
            with psycopg.connect(
                host=config["HOST"], port=config["PORT"] or 5432, user=config["USER"],
                password=config["PASSWORD"], dbname="postgres", autocommit=True,
            ) as admin:  # fmt: skip
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def simulated_machine(gpus: int = 4) -> Iterator[object]:
    """A simulated host registered, confirmed, probed and listed like a provider would."""
    import tempfile
    from pathlib import Path

    from hosts import services
    from hosts.devtools.sim_docker import ensure_dockerd, ensure_image
    from hosts.devtools.simulation import SimHostSpec, create_host, default_gpus
    from hosts.keys import team_public_key
    from marketplace.models import Membership, Role, Team, User

    ensure_dockerd()
    ensure_image()
    with tempfile.TemporaryDirectory() as tmp:
        from deploy.cluster import free_port

        spec = SimHostSpec(
            name="bench",
            address="127.0.9.10",
            port=free_port(),  # two benches at once (two people's) each get their own sshd
            gpus=default_gpus(gpus),
            port_range=(19000, 19099),
        )
        host = create_host(Path(tmp) / "bench", spec)
        try:
            user = User.objects.create_user("bench-provider", "bp@example.com", "x")
            team = Team.objects.create(name="bench provider", personal=True)
            Membership.objects.create(team=team, user=user, role=Role.OWNER)
            host.authorize(team_public_key(team.pk))
            machine = services.machine_register(
                team_id=team.pk, name="bench", address=host.address, port=host.port, ssh_user="root"
            )
            services.machine_fetch_host_key(machine_id=machine.pk)
            services.machine_confirm_host_key(
                machine_id=machine.pk, fingerprint=host.host_key_fingerprint
            )
            services.machine_probe(machine_id=machine.pk)
            services.machine_set_terms(
                machine_id=machine.pk,
                price_per_gpu_hour=500_000,
                storage_price_per_gb_month=100_000,
                min_gpus=1,
                end_date=None,
                location="US",
            )
            machine = services.machine_set_listed(machine_id=machine.pk, listed=True)
            yield machine
        finally:
            host.stop()
            import subprocess

            ids = subprocess.run(
                ["docker", "ps", "-aq", "--filter", "label=gpumkt.bench=1"],
                capture_output=True,
                text=True,
            ).stdout.split()
            if ids:
                subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)


def web_bench_environment(name: str):
    """For a bench that starts web processes: a private Redis (not started yet), and this
    process's Django pointed at it, at the scratch database ``gpumkt_bench_<name>`` (plus
    ``BENCH_DATABASE_SUFFIX``), at a secret key the web processes share (they read the
    sessions and keys this process makes) and at a platform SSH key file they share too
    (``shared_settings``). Call before Django is set up."""
    import tempfile
    from pathlib import Path

    from deploy.cluster import Redis

    redis = Redis(Path(tempfile.mkdtemp(prefix=f"gpumkt-{name}-redis-")), persistent=False)
    os.environ.setdefault("DEBUG", "1")
    # BENCH_DATABASE_SUFFIX keeps two people's runs on one server apart (the database is
    # dropped and made afresh).
    suffix = os.environ.get("BENCH_DATABASE_SUFFIX", "")
    os.environ["DATABASE_URL"] = (
        f"postgres://gpumkt:gpumkt@127.0.0.1:5432/gpumkt_bench_{name}{suffix}"
    )
    os.environ["DJANGO_SETTINGS_MODULE"] = "marketplace.settings"
    os.environ["REDIS_URL"] = redis.url
    os.environ["SECRET_KEY"] = f"bench-{name}-" + "k" * 50
    # Each provider team's SSH key is derived from this file (hosts/keys.py): a machine this
    # process authorized and probed is reached by a recipe worker only if the worker derives
    # the same key, and the recipe's environment file names another file (its state folder).
    keys = Path(tempfile.mkdtemp(prefix=f"gpumkt-{name}-keys-"))
    os.environ["PLATFORM_SSH_KEY_PATH"] = str(keys / "platform_ssh_key")
    return redis


def shared_settings() -> dict[str, str]:
    """What the recipe's processes a bench starts must share with the bench's own Django
    (``web_bench_environment``), as overrides of the environment file."""
    return {
        "SECRET_KEY": os.environ["SECRET_KEY"],
        "PLATFORM_SSH_KEY_PATH": os.environ["PLATFORM_SSH_KEY_PATH"],
        "ALLOWED_HOSTS": "localhost,127.0.0.1",
        "HTTPS_ONLY": "0",
    }


@contextlib.contextmanager
def private_redis(redis) -> Iterator[object]:
    """The bench's private Redis, running for the block."""
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


@contextlib.contextmanager
def web_processes(redis, *, overrides: dict[str, str] | None = None) -> Iterator[object]:
    """Two web processes started from the recipe's unit (deploy/) on this bench's database,
    Redis and secret key, plain HTTP; stopped at the end. ``BENCH_WEB_ENV`` (space-separated
    ``KEY=value``) adds settings, e.g. to compare one."""
    import tempfile
    from pathlib import Path

    from deploy.cluster import LocalCluster

    extra = dict(
        item.split("=", 1) for item in os.environ.get("BENCH_WEB_ENV", "").split() if "=" in item
    )
    cluster = LocalCluster(
        Path(tempfile.mkdtemp(prefix="gpumkt-bench-web-")),
        database_url=os.environ["DATABASE_URL"],
        redis_url=redis.url,
        webs=2,
        workers=0,
        overrides={
            # The log level is the recipe's (production logs every request at INFO).
            **shared_settings(),
            **(overrides or {}),
            **extra,
        },
    )
    try:
        for port in cluster.web_ports:
            cluster.start_web(port)
        yield cluster
    finally:
        cluster.stop()


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process on this machine, from /proc (None once it is
    gone): for the database backends and web processes a bench drives."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def budget_row(
    bench: str,
    *,
    budget: str,
    figure: str,
    floor: str = "—",
    ratio: float | None = None,
    within: bool,
) -> None:
    """One row of ``make bench``'s table (bench/bench_table.py): what was measured against one
    budget, the floor measured beside it (the same work with nothing of ours around it) and
    the figure divided by the budget, as the bench prints it (for a "≥" budget above 1 is
    within, for a "≤" one below 1). Added
    to the JSON-lines file ``BENCH_RESULTS`` names, with the load average; nothing without
    it (a bench run alone prints its figures anyway)."""
    import json

    path = os.environ.get("BENCH_RESULTS")
    if not path:
        return
    row = {
        "bench": bench, "budget": budget, "figure": figure, "floor": floor, "ratio": ratio,
        "within": within, "load": round(os.getloadavg()[0], 1),
    }  # fmt: skip
    with open(path, "a", encoding="utf-8") as results:
        results.write(json.dumps(row, ensure_ascii=False) + "\n")


def reference_loop_ms(rounds: int = 5) -> float:
    """The machine's speed as one number: the fastest of ``rounds`` runs of a fixed Python
    loop (3,000,000 additions), in milliseconds. Not a budget: the same code measured on a
    machine whose loop takes twice as long shows figures about twice as slow, so ``make
    bench`` prints it before and after the benches, and a round is compared with another only
    beside it."""
    import time

    fastest = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        total = 0
        for n in range(3_000_000):
            total += n
        fastest = min(fastest, (time.perf_counter() - started) * 1000)
    return fastest


def reference_round_trip_us(trips: int = 5000, rounds: int = 3) -> float:
    """The machine's other speed: the fastest of ``rounds`` means of a byte sent to another
    thread over a local socket and sent back, in microseconds. Every request, statement and
    task crosses sockets and wakes threads; on a machine where this is slow (a microVM's
    system calls and wake-ups) every bench that talks to PostgreSQL or Redis is slower,
    however fast its Python loop."""
    import socket
    import threading
    import time

    fastest = float("inf")
    for _ in range(rounds):
        near, far = socket.socketpair()

        def echo(far: socket.socket = far) -> None:
            for _ in range(trips):
                far.sendall(far.recv(1))

        echoing = threading.Thread(target=echo)
        echoing.start()
        started = time.perf_counter()
        for _ in range(trips):
            near.sendall(b"x")
            near.recv(1)
        fastest = min(fastest, (time.perf_counter() - started) / trips * 1e6)
        echoing.join()
        near.close()
        far.close()
    return fastest


if __name__ == "__main__":  # scripts/bench.sh: the machine's speeds, for the table's header
    print(f"{reference_loop_ms():.0f} ms and {reference_round_trip_us():.0f} µs")
