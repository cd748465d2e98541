"""Shared fixtures: the three users of every tenancy test, API clients, simulated hosts."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from rest_framework.test import APIClient

from marketplace.models import ApiKey, Role, Team
from marketplace.services.accounts import api_key_create
from tests.factories import PASSWORD, TeamFactory, UserFactory, add_member  # noqa: F401

# Hypothesis's timing checks (a deadline per example, "input generation is slow") measure the
# machine, not the code: on a 2-core machine running the suite in parallel a draw can stall
# for a second. The properties are still checked on every example.
#
# Two budgets: "ci" (CI=true, and `make test`) draws every example the tests ask for; "dev"
# (otherwise: the inner loop, `make test-quick`) a quarter of them. HYPOTHESIS_PROFILE names
# one outright.
FULL_EXAMPLES = 100
settings.register_profile(
    "ci", max_examples=FULL_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", settings.get_profile("ci"), max_examples=FULL_EXAMPLES // 4)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE")
    or ("ci" if os.environ.get("CI", "").lower() in ("true", "1") else "dev")
)


def examples(full: int) -> int:
    """The examples a property that asks for ``full`` of them draws under the loaded profile:
    all under "ci", as many fewer as the profile's default is (at least 10)."""
    return max(min(full, 10), full * settings.default.max_examples // FULL_EXAMPLES)


# A test that uses one of these fixtures starts real hosts (sshd and Docker), a live server
# and worker, or Chromium: it is a system (or browser) test whatever its module's marks say,
# so `-m "not system and not browser"` (make test-quick) leaves every such test out.
SYSTEM_FIXTURES = {"docker_engine", "live_server_url", "celery_worker"}
BROWSER_FIXTURES = {"browser"}


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SYSTEM_FIXTURES and item.get_closest_marker("system") is None:
            item.add_marker(pytest.mark.system)
        if used & BROWSER_FIXTURES and item.get_closest_marker("browser") is None:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """Where each xdist worker's test database comes from.

    PostgreSQL: pytest-django's per-worker database, made as a copy of the migrated template
    (core/migrated_template.py), so the migrations run once for the whole run, not once for
    each worker; ``migrate`` then finds the copy up to date.

    SQLite (the second money job of scripts/test.sh, as ``make run`` uses it): a test database
    in a file, not pytest-django's shared in-memory one: shared-cache memory databases lock
    whole tables ("database table is locked") where a file with WAL, IMMEDIATE transactions
    and a busy timeout (marketplace/settings.py) queues writers, so the concurrency tests meet
    what production meets. One file per xdist worker (the workers inherit one VAR_DIR from the
    controller, so the worker's name goes in the file's)."""
    from django.conf import settings
    from django.db import connections

    from core import migrated_template

    database = settings.DATABASES["default"]
    if connections["default"].vendor == "postgresql" and migrated_template.enabled():
        database.setdefault("TEST", {})["TEMPLATE"] = migrated_template.template_ensure(
            database, base=database["NAME"]
        )
    elif database["ENGINE"] == "django.db.backends.sqlite3":
        var_dir = Path(os.environ["VAR_DIR"])
        var_dir.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        database.setdefault("TEST", {})["NAME"] = str(var_dir / f"test-money-{worker}.sqlite3")


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test databases, with each process's connection pool closed before they are
    dropped (a pooled connection left open would keep PostgreSQL from dropping them)."""
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for connection in connections.all():
            if hasattr(connection, "close_pool"):
                connection.close_pool()
        _other_sessions_end(connections["default"])


def _other_sessions_end(connection) -> None:
    """End whatever session is still on this process's test database once its own pool is
    closed (a thread's connection that outlived its thread): PostgreSQL refuses to drop a
    database anyone is on. Logged, so the one that stayed can be found."""
    if connection.vendor != "postgresql":
        return
    import psycopg

    params = connection.settings_dict
    with psycopg.connect(
        dbname="postgres",
        host=params["HOST"] or None,
        port=params["PORT"] or None,
        user=params["USER"] or None,
        password=params["PASSWORD"] or None,
        autocommit=True,
    ) as admin:
        others = admin.execute(
            "SELECT pid, application_name, state, left(query, 200) FROM pg_stat_activity"
            " WHERE datname = %s",
            [params["NAME"]],
        ).fetchall()
        for pid, *_ in others:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    if others:
        logging.getLogger(__name__).warning("ended sessions left on the test database: %s", others)


# Sessions on the test database that are running a statement or hold a transaction open:
# the flush's TRUNCATE would wait for their locks, or deadlock with them.
BUSY_SESSIONS = """
    SELECT pid, application_name, state, left(query, 200) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND backend_type = 'client backend' AND state <> 'idle'
"""


def _transactional(request) -> bool:
    marker = request.node.get_closest_marker("django_db")
    if marker is not None and (marker.kwargs.get("transaction") or marker.args[:1] == (True,)):
        return True
    return bool({"transactional_db", "live_server"} & set(request.fixturenames))


@pytest.fixture(autouse=True)
def database_quiet_before_flush(request):
    """A transactional test's database is flushed (TRUNCATE of every table) after the test.
    Other processes and threads on it (the browser tests' live server and worker, a live
    server thread, a socket consumer) may still be finishing a query then; the flush waits
    here until none is, and ends a session still busy after 30 s (a stuck one) so the flush
    neither deadlocks nor hangs. Idle sessions hold no locks and stay."""
    if not _transactional(request):
        yield
        return
    # Already set up by the marker; asked for here so this teardown runs before the flush.
    request.getfixturevalue("transactional_db")
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    logger = logging.getLogger(__name__)
    started = time.monotonic()
    first = None
    with connection.cursor() as cursor:
        while True:
            cursor.execute(BUSY_SESSIONS)
            busy = cursor.fetchall()
            first = first or busy
            if not busy:
                if first:
                    waited = time.monotonic() - started
                    logger.info("waited %.2f s for sessions busy after the test: %s", waited, first)
                return
            if time.monotonic() - started > 30:
                break
            time.sleep(0.05)
        logger.warning("ending sessions busy 30 s after the test: %s", busy)
        for pid, *_ in busy:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.fixture
def team(db) -> Team:
    return TeamFactory(name="Acme GPUs")


@pytest.fixture
def owner(team):
    user = UserFactory(username="owner")
    add_member(team, user, Role.OWNER)
    return user


@pytest.fixture
def teammate(team):
    user = UserFactory(username="teammate")
    add_member(team, user, Role.MEMBER)
    return user


@pytest.fixture
def outsider(db):
    """A user with a team of their own and no link to ``team``."""
    return UserFactory(username="outsider")


def client_for(client, user, team: Team | None = None):
    client.force_login(user)
    if team is not None:
        session = client.session
        session["active_team_id"] = team.id
        session.save()
    return client


@pytest.fixture
def owner_client(client, owner, team):
    return client_for(client, owner, team)


@pytest.fixture
def api_client():
    return APIClient()


def key_client(
    team: Team, *, access=ApiKey.Access.WRITE, audience=ApiKey.Audience.ALL
) -> APIClient:
    membership = team.memberships.filter(role=Role.OWNER).first()
    issued = api_key_create(membership=membership, name="test", access=access, audience=audience)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    return client


# --- simulated hosts (real sshd + real Docker) -------------------------------------------


def _worker_index() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


def _namespace() -> int:
    return int(os.environ.get("TEST_NAMESPACE", "0"))


def sim_container_label() -> str:
    """Containers started by tests carry this label, so the session removes them at the end."""
    return f"gpumkt.test-run=ns{_namespace()}-w{_worker_index()}"


@pytest.fixture(scope="session")
def docker_engine():
    from hosts.devtools.sim_docker import ensure_dockerd, ensure_gpu_bench_image, ensure_image

    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.fail("system tests need root and docker.io (make test installs it)")
    ensure_dockerd()
    image = ensure_image()
    # A simulated host's verification runs the stand-in GPU benchmark image (as `make run`'s
    # simhosts makes it): made here, so a test's hosts never depend on another test having
    # made it first (on a fresh machine they would try to pull it from a registry).
    ensure_gpu_bench_image()
    return image


# Each simulated host publishes containers' ports on a range of its own, held for as long as
# the worker process that made it lives: a lock on the range's file, which the kernel drops
# when the process ends, however it ends. Ranges are taken from one pool for the whole machine
# (every namespace, every run beside this one), so no two live hosts ever share a port. A
# counter per namespace that wrapped after 120 hosts did: a full run makes ~170, all alive
# until its end, and a host's containers then failed on "port is already allocated".
# Below the simulated hosts' own SSH ports (``SIM_SSH_PORTS`` + 1000 × namespace and up):
# docker publishes on 0.0.0.0, which a host's sshd on 127.x.y.z:23000 blocks, and a range
# taken there failed its launches with "bind: address already in use". Below the ranges the
# benches' simulated host (19000-19099, bench_common) and `make run`'s (20000 and up,
# simhosts) publish on too, so a suite beside them never meets theirs. (All of it is below
# Linux's ephemeral range, 32768+, where outgoing connections take their local ports.)
SIM_SSH_PORTS = 23000
SIM_PORTS_PER_HOST = 20
SIM_PORTS = (10000, 19000)
_held_port_ranges: list = []  # this process's locked range files, kept open


def _sim_port_range_start() -> int:
    import fcntl
    import random
    import tempfile

    folder = Path(tempfile.gettempdir()) / "gpumkt-test-sim-port-ranges"
    folder.mkdir(exist_ok=True)
    ranges = (SIM_PORTS[1] - SIM_PORTS[0]) // SIM_PORTS_PER_HOST
    # From a random range on: a range a crashed run's containers may still hold is not the
    # next one taken.
    first = random.randrange(ranges)
    for step in range(ranges):
        index = (first + step) % ranges
        file = open(folder / f"{index}.lock", "a")  # noqa: SIM115 (held open on purpose)
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.close()
            continue
        _held_port_ranges.append(file)
        return SIM_PORTS[0] + index * SIM_PORTS_PER_HOST
    pytest.fail(f"every simulated host port range in {SIM_PORTS} is held by a live test process")


@pytest.fixture(scope="session")
def sim_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("simhosts")


@pytest.fixture(scope="session")
def sim_host_factory(docker_engine, sim_root):
    """Makes simulated hosts on addresses and ports that no other xdist worker uses. A host
    lets no team in until a test authorizes the team's key (``host.authorize``), as a
    provider would; the helpers that add machines do."""
    from hosts.devtools import sim_docker
    from hosts.devtools.simulation import SimHostSpec, create_host, default_gpus

    worker, namespace = _worker_index(), _namespace()
    made = []

    def make(
        gpus: int = 4,
        gpu_name: str = "NVIDIA GeForce RTX 4090",
        memory_mib: int = 24564,
        mps: bool = True,
        disk_enforced: bool = False,
    ):
        """``disk_enforced``: the host's Docker is the second engine, whose btrfs storage
        driver caps a container's disk (started on first use, with the test images)."""
        docker_host = sim_docker.DOCKER_SOCKET
        if disk_enforced:
            docker_host = sim_docker.ensure_quota_dockerd()
            sim_docker.ensure_image(docker_host=docker_host)
        n = len(made)
        ports = _sim_port_range_start()
        spec = SimHostSpec(
            name=f"ns{namespace}-w{worker}-h{n}",
            address=f"127.{1 + namespace}.{20 + worker}.{10 + n}",
            port=SIM_SSH_PORTS + namespace * 1000 + worker * 100 + n,
            gpus=default_gpus(gpus, name=gpu_name, memory_mib=memory_mib),
            port_range=(ports, ports + SIM_PORTS_PER_HOST - 1),
            mps=mps,
            docker_host=docker_host,
        )
        host = create_host(sim_root / spec.name, spec)
        made.append(host)
        return host

    yield make
    for host in made:
        host.stop()
    for engine in {host.spec.docker_host for host in made} | {sim_docker.DOCKER_SOCKET}:
        env = {**os.environ, "DOCKER_HOST": engine}
        ids = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={sim_container_label()}"],
            capture_output=True,
            text=True,
            env=env,
        ).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, env=env)


@pytest.fixture(scope="session")
def sim_host(sim_host_factory):
    """One shared 4-GPU simulated host for tests that only read from it."""
    return sim_host_factory(gpus=4)
