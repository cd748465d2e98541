"""The launches of rentals committed together (a sweep placing a deployment's replicas, rents
that reached a web process together) go to the broker as one message, which a worker fans out
into each rental's own launch: one round trip to Redis for the batch instead of one each.
Checked on the real broker (the test's Redis) and a real Celery worker: each rental is
launched once, under the log context of its own order; a batch's message lost after the
commit (Redis restarted, the process died) is queued again by the work sweep."""

from __future__ import annotations

import base64
import contextlib
import contextvars
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import structlog
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from marketplace.celery import app as celery_app
from marketplace.rentals.renting import Rented, rentals_create
from marketplace.rentals.terms import RentalRequest
from scheduler import work
from scheduler.models import Instance
from tests.conftest import sim_container_label
from tests.marketplace.conftest import containers_named, machine_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = "marketplace.tasks.rental_launch"
FAN_OUT = "marketplace.tasks.work_fan_out"


@pytest.fixture
def broker():
    """Tasks go to the real broker (this test's Redis, under its key prefix) instead of
    running in place; the broker's queues are emptied before and after."""
    celery_app.control.purge()
    # Celery reads its settings under the CELERY_ namespace: that is the name to change.
    eager = celery_app.conf.CELERY_TASK_ALWAYS_EAGER
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = False
    yield
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = eager
    celery_app.control.purge()


def queued() -> list[tuple[str, list]]:
    """(task name, arguments) of each message waiting in the broker, read from Redis."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    messages = []
    for key in client.scan_iter(f"{os.environ['BROKER_KEY_PREFIX']}*"):
        if client.type(key) != b"list":
            continue
        for raw in client.lrange(key, 0, -1):
            message = json.loads(raw)
            args = json.loads(base64.b64decode(message["body"]))[0]
            messages.append((message["headers"]["task"], args))
    return messages


def rent(team, machine, count: int, contexts=None) -> list[Instance]:
    request = RentalRequest(
        machine_id=machine.pk, gpu_count=1, image="gpumkt/busybox:latest", hours=1,
        entrypoint="sh", args=["-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
    )  # fmt: skip
    outcomes = rentals_create([(team, request)] * count, contexts)
    assert all(isinstance(outcome, Rented) for outcome in outcomes), outcomes
    return [outcome.instance for outcome in outcomes]


def test_rentals_committed_together_queue_their_launches_as_one_message(
    broker, funded_team, sim_host_factory, provider_team
):
    machine = machine_for(sim_host_factory(gpus=6), provider_team)
    together = rent(funded_team, machine, 3)
    assert len(queued()) == 1
    [(task, (state, batch))] = queued()
    assert (task, state) == (FAN_OUT, "launching")
    assert sorted(pk for pk, _ in batch) == sorted(i.pk for i in together)

    celery_app.control.purge()
    alone = rent(funded_team, machine, 1)
    assert queued() == [(LAUNCH, [alone[0].pk])]  # a rent alone: its own launch, as before

    celery_app.control.purge()
    with contextlib.suppress(RuntimeError), transaction.atomic():
        rolled_back = rent(funded_team, machine, 2)
        raise RuntimeError("something after the rents failed")
    assert queued() == []  # nothing to launch for rentals that never were
    assert not Instance.objects.filter(pk__in=[i.pk for i in rolled_back]).exists()


def _start_worker(log: Path) -> subprocess.Popen:
    """A Celery worker on the test's database and broker, logging JSON lines."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "LOG_FORMAT": "json",
        "CONTAINER_EXTRA_LABELS": sim_container_label(),
        "PYTHONPATH": str(ROOT),
    }
    argv = [
        sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--pool", "threads",
        "--concurrency", "4", "--loglevel", "info", "--without-gossip", "--without-mingle",
        "--hostname", f"batches-{uuid.uuid4().hex[:8]}@%h",
    ]  # fmt: skip
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _stop(worker: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)


def _logged_as(request_id: str) -> contextvars.Context:
    """The context of a request with this id, as the web process's middleware binds it."""

    def bind() -> contextvars.Context:
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        return contextvars.copy_context()

    return contextvars.Context().run(bind)


def test_a_worker_launches_each_rental_of_a_batch_once_and_a_lost_batch_is_queued_again(
    broker, funded_team, sim_host_factory, provider_team, tmp_path
):
    machine = machine_for(sim_host_factory(gpus=5), provider_team)
    # A batch whose message is lost after the commit (Redis restarted without persistence).
    lost = rent(funded_team, machine, 2)
    celery_app.control.purge()
    assert queued() == []
    assert not work.work_due().filter(pk__in=[i.pk for i in lost]).exists()  # within grace
    # The grace passes: the work sweep (beat's) queues the batch's launches again, together.
    Instance.objects.filter(pk__in=[i.pk for i in lost]).update(
        work_due_at=timezone.now() - work.SWEEP_GRACE - timedelta(seconds=1)
    )
    assert work.work_sweep() == 2
    assert [(task, state) for task, (state, _) in queued()] == [(FAN_OUT, "launching")]

    # A batch of three rents, each from its own request.
    request_ids = [f"batch-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    together = rent(funded_team, machine, 3, [_logged_as(r) for r in request_ids])
    assert len(queued()) == 2

    log = tmp_path / "worker.log"
    worker = _start_worker(log)
    try:
        instances = lost + together
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            states = set(
                Instance.objects.filter(pk__in=[i.pk for i in instances]).values_list(
                    "state", flat=True
                )
            )
            if states == {"running"}:
                break
            assert worker.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        assert states == {"running"}, log.read_text()[-3000:]
        assert queued() == []
    finally:
        _stop(worker)

    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    for instance in instances:
        launches = [
            line for line in lines if line["event"].startswith(f"launching instance {instance.pk} ")
        ]
        assert len(launches) == 1, [line["event"] for line in lines]
        assert len(containers_named(instance.container_name)) == 1
        instance.refresh_from_db()
        assert instance.attempts == 1
    for instance, request_id in zip(together, request_ids, strict=True):
        [launch] = [
            line for line in lines if line["event"].startswith(f"launching instance {instance.pk} ")
        ]
        assert launch["request_id"] == request_id
