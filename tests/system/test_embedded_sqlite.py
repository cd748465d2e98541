"""The embedded default (``make run``: SQLite, one web, one worker with two processes, beat)
holds the load one user makes: 4 threads rent, stop and destroy 20 instances at once through
the API while beat's heartbeats, sweeps and metering write too, and no process ever meets
"database is locked".

Everything is real and separate from the rest of the suite: its own SQLite file, its own
Redis, its own platform key, the processes ``make run`` starts, on simulated hosts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import sim_container_label
from tests.ports import port_in_log, serve_on_a_free_port

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
THREADS, PER_THREAD = 4, 5
QUICK_STOP = ["-c", "trap 'exit 0' TERM; echo up; while :; do sleep 1; done"]
LOCK_ERRORS = ("database is locked", "database table is locked", "OperationalError")


class Stack:
    """The processes of ``make run`` on a fresh SQLite file."""

    def __init__(self, root: Path, hosts: list[dict]):
        self.root = root
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        redis_port = self._redis()
        self.env = {
            **os.environ,
            "DEBUG": "1",
            "DATABASE_URL": f"sqlite:///{root / 'marketplace.sqlite3'}",
            "VAR_DIR": str(root),
            "PLATFORM_SSH_KEY_PATH": str(root / "platform_ssh_key"),
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "CELERY_TASK_ALWAYS_EAGER": "0",
            "CONTAINER_EXTRA_LABELS": sim_container_label(),
            "PYTHONPATH": str(ROOT),
        }
        self.env.pop("SECRET_KEY", None)  # DEBUG makes its own under VAR_DIR, as make run does
        self.manage("migrate", "--noinput", "-v0")
        (root / "hosts.json").write_text(json.dumps(hosts))
        made = self.manage("demo_data", "--simhosts", str(root / "hosts.json"))
        assert "not ready" not in made, made  # demo_data waits for its machines to be online
        py = sys.executable
        self._spawn(
            "worker",
            [py, "-m", "celery", "-A", "marketplace", "worker", "-l", "info", "--concurrency", "2"],
        )
        self._spawn(
            "beat",
            [py, "-m", "celery", "-A", "marketplace", "beat", "-l", "info",
             "--schedule", str(root / "celerybeat-schedule")],
        )  # fmt: skip
        web = self._spawn(
            "web",
            [py, "-m", "uvicorn", "marketplace.asgi:application", "--host", "127.0.0.1",
             "--port", "0"],
        )  # fmt: skip
        # The OS hands uvicorn a free port, and its start-up line names it.
        self.port = port_in_log(root / "web.log", r"Uvicorn running on http://[\d.]+:(\d+)", web)
        self._wait_for_web()
        self.key = self.manage(
            "shell",
            "--no-imports",
            "-c",
            "from marketplace.models import Membership; "
            "from marketplace.services.accounts import api_key_create; "
            "m = Membership.objects.get(user__username='renter', team__personal=True); "
            "print(api_key_create(membership=m, name='load', access='write').secret)",
        ).strip()

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def _redis(self) -> int:
        """redis-server on a port the OS handed out (its ``--port 0`` would mean no TCP)."""
        log = self.root / "redis.log"
        self.logs.append(log)

        def start(port: int) -> subprocess.Popen:
            argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            return subprocess.Popen(
                argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
            )

        process, port = serve_on_a_free_port(start)
        self.processes.append(process)
        return port

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        self.logs.append(log)
        process = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.processes.append(process)
        return process

    def _wait_for_web(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/accounts/login/", timeout=2)
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError((self.root / "web.log").read_text()[-3000:])

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/v1{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def stop(self) -> None:
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def wait_for_state(stack: Stack, instance_id: int, wanted: set[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    state = "?"
    while time.monotonic() < deadline:
        status, body = stack.api("GET", f"/instances/{instance_id}/")
        if status == 404 and "destroyed" in wanted:
            return "destroyed"  # the list and detail leave destroyed instances out
        state = body.get("state", "?")
        if state in wanted:
            return state
        time.sleep(0.3)
    raise AssertionError(f"instance {instance_id} stayed {state}, wanted {wanted}")


def test_the_embedded_sqlite_default_holds_one_users_load(sim_host_factory, tmp_path):
    hosts = [sim_host_factory(gpus=4).to_dict() for _ in range(2)]
    stack = Stack(tmp_path, hosts)
    problems: list[str] = []
    done: list[int] = []
    try:
        status, body = stack.api("GET", "/offers/?q=num_gpus>=1")
        assert status == 200, body
        machines = sorted({offer["machine_id"] for offer in body["offers"]})  # bundles: 1, 2, 4
        assert len(machines) == 2, body

        def renter(number: int) -> None:
            for round_ in range(PER_THREAD):
                machine_id = machines[(number + round_) % len(machines)]
                status, body = stack.api(
                    "POST",
                    "/instances/",
                    {
                        "machine_id": machine_id, "num_gpus": 1, "image": "gpumkt/busybox:latest",
                        "duration_hours": 1, "entrypoint": "sh", "args": QUICK_STOP,
                    },
                )  # fmt: skip
                if status != 201:
                    problems.append(f"rent: {status} {body}")
                    continue
                instance_id = body["id"]
                try:
                    wait_for_state(stack, instance_id, {"running"})
                    status, body = stack.api("POST", f"/instances/{instance_id}/stop/")
                    assert status == 202, body
                    wait_for_state(stack, instance_id, {"stopped"})
                    status, body = stack.api("DELETE", f"/instances/{instance_id}/")
                    assert status == 202, body
                    wait_for_state(stack, instance_id, {"destroyed"})
                    done.append(instance_id)
                except AssertionError as error:
                    problems.append(f"instance {instance_id}: {error}")

        threads = [threading.Thread(target=renter, args=(n,)) for n in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
    finally:
        stack.stop()
    logs = {log.name: log.read_text(errors="replace") for log in stack.logs}
    locked = [
        f"{name}: {line}"
        for name, text in logs.items()
        for line in text.splitlines()
        if any(error in line for error in LOCK_ERRORS)
    ]
    assert not locked, "\n".join(locked[:20])
    assert not problems, "\n".join(problems) + "\n" + logs["worker.log"][-3000:]
    assert len(done) == THREADS * PER_THREAD
    assert " 500 " not in logs["web.log"], logs["web.log"][-3000:]
