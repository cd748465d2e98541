"""A real Celery worker (prefork, a separate process): its exporter serves the tasks its pool
children ran, and its log lines carry the request id of the request that queued the task."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import structlog
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from marketplace.celery import app as celery_app
from tests.ports import serve_on_a_free_port

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored"),
]
ROOT = Path(__file__).resolve().parents[2]
TASK = "marketplace.tasks.invitations_expire"


def database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def start_worker(log: Path, port: int, metrics_dir: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "LOG_FORMAT": "json",
        "WORKER_METRICS_PORT": str(port),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "PYTHONPATH": str(ROOT),
    }
    argv = [
        sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--pool", "prefork",
        "--concurrency", "2", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--hostname", f"obs-{uuid.uuid4().hex[:8]}@%h",
    ]  # fmt: skip
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def tasks_counted(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpumkt_celery_tasks_total" and sample.labels == {
                "task": TASK,
                "outcome": "succeeded",
            }:
                return sample.value
    return 0.0


def test_a_worker_exports_its_childrens_task_metrics_and_logs_the_queuing_request_id(
    tmp_path,
):
    celery_app.control.purge()
    log = tmp_path / "worker.log"
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "counter_99999.db").write_bytes(b"stale")  # emptied at start
    worker, port = serve_on_a_free_port(
        lambda port: start_worker(log, port, tmp_path / "metrics"), timeout=90
    )
    try:
        request_id = f"test-request-{uuid.uuid4().hex[:8]}"
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            sent = celery_app.send_task(TASK)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and tasks_counted(port) != 1:
            assert worker.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        assert tasks_counted(port) == 1, log.read_text()[-3000:]
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        celery_app.control.purge()

    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    succeeded = [line for line in lines if line["event"] == "task_succeeded"]
    assert len(succeeded) == 1, lines
    assert succeeded[0]["task_id"] == sent.id
    assert succeeded[0]["request_id"] == request_id
