"""The production recipe (deploy/: systemd units, the environment file, the Caddyfile) parses,
passes Django's deploy check with its environment, and its processes start from the units'
own command lines: two web processes behind Caddy over TLS, a worker and beat, against a
PostgreSQL and a Redis of the test's own.
"""

from __future__ import annotations

import http.client
import os
import re
import secrets
import shutil
import subprocess
import sys
import time

import pytest

from deploy.cluster import LocalCluster, Postgres, Redis
from deploy.recipe import (
    CADDY_DROP_IN,
    CADDYFILE,
    ENV_EXAMPLE,
    UNITS,
    UNITS_DIR,
    Recipe,
    Unit,
    command_line,
    env_file_parse,
    env_file_write,
)

ROOT = sys.modules["deploy.cluster"].ROOT


@pytest.fixture
def recipe(tmp_path) -> Recipe:
    recipe = Recipe(root=ROOT, scratch=tmp_path)
    env = env_file_parse(ENV_EXAMPLE.read_text())
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    env_file_write(recipe.env_path, env)
    return recipe


def test_the_units_pass_systemd_analyze_verify(recipe):
    """systemd itself reads every unit (with an instance of each template) and checks that
    each command it would run exists and is executable."""
    assert shutil.which("systemd-analyze"), "make test installs systemd"
    paths = recipe.rendered()
    for template, instance in [("gpumkt-web@.service", "8001"), ("gpumkt-worker@.service", "9808")]:
        link = recipe.units_dir / template.replace("@.", f"@{instance}.")
        link.symlink_to(recipe.units_dir / template)
        paths.append(link)
    done = subprocess.run(
        ["systemd-analyze", "verify", *[str(path) for path in paths if "@." not in path.name]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    ours = [line for line in done.stderr.splitlines() if "gpumkt" in line]
    assert done.returncode == 0 and not ours, done.stderr


def test_every_variable_the_units_and_caddy_read_is_in_the_environment_file():
    example = env_file_parse(ENV_EXAMPLE.read_text())
    used: set[str] = set()
    for name in UNITS:
        text = (UNITS_DIR / name).read_text()
        used |= set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))
        unit = Unit.parse(name, text)
        assert unit.value("EnvironmentFile") in {"", "/etc/gpumkt/gpumkt.env"}
    # Caddy's {$VAR} without a default must come from the file; {$VAR:default} may.
    used |= set(re.findall(r"\{\$([A-Za-z_][A-Za-z0-9_]*)\}", CADDYFILE.read_text()))
    assert used, "the recipe reads no variables?"
    assert used <= set(example), f"not in gpumkt.env.example: {sorted(used - set(example))}"


def test_a_command_line_is_expanded_as_systemd_expands_it():
    env = {"WEB_BIND": "10.0.0.5", "LIST": "a  b", "EMPTY": ""}
    line = "-/opt/x/uvicorn app --host ${WEB_BIND} --port %i $LIST --name w%i@%H 100%%"
    argv = command_line(line, instance="8001", env=env)
    assert argv[:6] == ["/opt/x/uvicorn", "app", "--host", "10.0.0.5", "--port", "8001"]
    assert argv[6:8] == ["a", "b"]  # $VAR splits, ${VAR} stays one word
    assert argv[8] == "--name" and re.fullmatch(r"w8001@.+", argv[9]) and argv[10] == "100%"


def test_caddy_runs_without_printing_its_environment_to_the_journal():
    """Debian's caddy.service runs ``caddy run --environ``, which logs every variable; the
    drop-in hands Caddy the environment file (secrets included), so it replaces the command."""
    drop_in = Unit.parse("gpumkt.conf", CADDY_DROP_IN.read_text())
    assert drop_in.value("EnvironmentFile") == "/etc/gpumkt/gpumkt.env"
    starts = drop_in.values("ExecStart")
    assert starts[0] == "" and len(starts) == 2  # an empty line clears Debian's command
    assert "--environ" not in starts[1] and "--config /etc/caddy/Caddyfile" in starts[1]


def test_caddy_accepts_the_caddyfile_with_the_environment_file(recipe):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(recipe.scratch),
        "XDG_DATA_HOME": str(recipe.scratch / "caddy-data"),
        **recipe.environment(),
    }
    done = subprocess.run(
        ["caddy", "validate", "--config", str(CADDYFILE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Valid configuration" in done.stdout + done.stderr


def test_the_recipes_environment_passes_the_deploy_check(recipe):
    env = {"PATH": os.environ["PATH"], "HOME": str(recipe.scratch), **recipe.environment()}
    env["VAR_DIR"] = str(recipe.scratch)  # the installed /var/lib/gpumkt does not exist here
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


@pytest.mark.system
def test_the_recipes_processes_start_answer_their_probes_and_stop(tmp_path):
    postgres = Postgres().start()
    redis = Redis(tmp_path / "redis").start()
    cluster = LocalCluster(
        tmp_path / "cluster", database_url=postgres.url, redis_url=redis.url, webs=2, workers=1
    )
    try:
        cluster.start()
        for port in cluster.web_ports:
            assert cluster.direct(port, "/healthz") == (200, '{"status": "alive"}')
            status, body = cluster.direct(port, "/readyz")
            assert status == 200 and '"failed": []' in body, body
            status, body = cluster.get(
                f"http://127.0.0.1:{port}/metrics",
                headers={"Authorization": f"Bearer {cluster.env['METRICS_TOKEN']}"},
            )
            assert status == 200 and "gpumkt_machines" in body
        # Through Caddy, over TLS checked against Caddy's own CA.
        assert cluster.get(cluster.front + "/readyz")[0] == 200
        assert cluster.get(cluster.front + "/metrics")[0] == 404  # never public
        for _ in range(6):
            status, body = cluster.get(cluster.front + "/accounts/login/")
            assert status == 200 and "csrfmiddlewaretoken" in body
        for web in cluster.webs:  # round robin: both served the console
            assert "GET /accounts/login/" in web.tail(200_000), web.name
        # The cluster gateway lives in the same Caddy: a route push (the beat's, every 30 s)
        # adds its server beside the Caddyfile's site, and the site hands it /clusters/*.
        pushed = cluster.manage(
            "shell", "-c", "from marketplace.clusters.routes import routes_push; print(routes_push())"
        )  # fmt: skip
        assert pushed.strip().splitlines()[-1] == "True", pushed
        status, body = cluster.get(cluster.front + "/clusters/1/service/")
        assert (status, body) == (401, '{"detail": "Authentication required."}')
        assert cluster.get(cluster.front + "/readyz")[0] == 200  # the site is still there
        # Plain HTTP on the proxy is sent to HTTPS.
        plain = http.client.HTTPConnection("localhost", int(cluster.env["GPUMKT_HTTP_PORT"]))
        plain.request("GET", "/accounts/login/")
        answer = plain.getresponse()
        assert answer.status == 308, answer.status
        assert answer.getheader("Location").startswith("https://localhost")
        plain.close()

        # Beat queues the deployments sweep every 10 s; the worker runs it.
        (worker,) = cluster.workers
        deadline = time.monotonic() + 45
        while "deployments_sweep" not in worker.tail(200_000) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "deployments_sweep" in worker.tail(200_000), worker.tail()
        assert "beat: Starting" in cluster.beat.tail(200_000)
    finally:
        cluster.stop()
        redis.stop()
        postgres.remove()
    for process in cluster.processes():
        # uvicorn ends by re-raising the SIGTERM it handled; systemd counts that as clean.
        assert process.popen.returncode in {0, -15}, f"{process.name}: {process.tail()}"
        log = without_pool_shutdown_race(process.tail(1_000_000))
        assert "Traceback" not in log, f"{process.name}: {process.tail()}"


# Celery's prefork pool, stopping, may read a child's pipe that the child already closed:
# billiard's ``_help_stuff_finish`` then logs "EOFError: Ran out of input" after "Warm
# shutdown" (an upstream race in celery/billiard, seen once in a clean-clone run). It happens
# after every task has finished and changes nothing; any other traceback still fails the test.
_POOL_SHUTDOWN_RACE = re.compile(
    r"Traceback \(most recent call last\):\n(?:  .*\n)*?.*_help_stuff_finish.*\n(?:  .*\n)*"
    r"EOFError: Ran out of input\n"
)


def without_pool_shutdown_race(log: str) -> str:
    return _POOL_SHUTDOWN_RACE.sub("", log)
