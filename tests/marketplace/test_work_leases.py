"""Launches, stops and destroys survive what goes wrong on the way: a worker killed mid-launch
(a real Celery worker, SIGKILL), a host that does not answer a stop or a destroy, a stop asked
for while a launch is still pulling. Each ends with exactly one outcome: one container, or
none; GPUs never given back while a container may still run on them; charges that end at the
renter's request, not at the host's confirmation."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from billing.models import Hold
from marketplace.celery import app as celery_app
from marketplace.models import Offer, Rental
from marketplace.rentals.metering import metering_sweep
from marketplace.tasks import rental_destroy, rental_stop
from scheduler import services as scheduler
from scheduler import work
from scheduler.models import GpuAllocation, Instance
from tests.conftest import key_client, sim_container_label
from tests.marketplace.conftest import containers_named, docker_inspect, machine_for, until
from tests.marketplace.registry import Registry

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
# Exits at once on `docker stop` (a bare `sleep` as PID 1 ignores SIGTERM for 10 s).
QUICK_STOP = ["-c", "trap 'exit 0' TERM; echo up; while :; do sleep 1; done"]


def rent(client, machine, image: str = "gpumkt/busybox:latest"):
    response = client.post(
        "/api/v1/instances/",
        {
            "machine_id": machine.pk, "num_gpus": 1, "image": image, "duration_hours": 2,
            "disk_gb": 10, "entrypoint": "sh", "args": QUICK_STOP, "ports": [],
        },
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    return Instance.objects.get(pk=response.json()["id"])


def live_gpus(instance: Instance) -> int:
    return GpuAllocation.objects.filter(instance=instance, released_at=None).count()


def running(container: str) -> bool:
    return docker_inspect(container)["State"]["Running"]


def test_a_stop_the_host_cannot_confirm_is_retried_and_charges_end_at_the_request(
    funded_team, sim_host_factory, provider_team
):
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    client = key_client(funded_team)
    instance = rent(client, machine)
    assert instance.state == "running"
    clock = Rental.objects.get(instance=instance)  # its GPU clock, as it runs
    assert clock.gpu_clock_since is not None
    host.stop()  # a power cut: the listener and every session end
    try:
        response = client.post(f"/api/v1/instances/{instance.pk}/stop/")
        assert response.status_code == 202, response.content
        assert response.json()["state"] == "stopping"
        instance.refresh_from_db()
        assert instance.state == "stopping"
        assert "has not answered yet" in instance.status_message
        # The container may still run on its GPU: nobody else can rent it meanwhile.
        assert live_gpus(instance) == 1
        assert Offer.objects.get(machine=machine, all_free=True).num_gpus == 0
        asked_at = instance.state_changed_at
        time.sleep(2)  # the host stays down a while: that time is not charged
    finally:
        host.start()
    confirmed_at = timezone.now()
    assert rental_stop(instance.pk) == "stopped"  # the retry, once the host answers
    instance.refresh_from_db()
    assert instance.state == "stopped" and not running(instance.container_id)
    assert live_gpus(instance) == 0
    assert Offer.objects.get(machine=machine, all_free=True).num_gpus == 1
    rental = Rental.objects.get(instance=instance)
    assert rental.gpu_clock_since is None
    # GPU time is what the clock read at the request (one instant: the request's, against the
    # clock's own start), not at the confirmation 2 s later.
    assert rental.gpu_seconds == clock.gpu_seconds_at(asked_at)
    assert rental.gpu_seconds < clock.gpu_seconds_at(confirmed_at) - 1
    metering_sweep()
    hold = Hold.objects.get(pk=rental.hold_id)
    # $0.50 per GPU-hour: 500,000 µ$ / 3,600 s per second, rounded once.
    assert hold.captured_gpu == (500_000 * rental.gpu_seconds + 1800) // 3600
    steps = [(e.from_state, e.to_state) for e in instance.events.all()][-2:]
    assert steps == [("running", "stopping"), ("stopping", "stopped")]


def test_a_destroy_settles_at_once_and_removes_the_container_once_the_host_answers(
    funded_team, sim_host_factory, provider_team
):
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    client = key_client(funded_team)
    instance = rent(client, machine)
    host.stop()
    try:
        assert client.delete(f"/api/v1/instances/{instance.pk}/").status_code == 202
        instance.refresh_from_db()
        assert instance.state == "destroying"
        rental = Rental.objects.get(instance=instance)
        hold = Hold.objects.get(pk=rental.hold_id)
        assert rental.settled_at is not None and hold.status == "released"
        assert live_gpus(instance) == 1  # until the container is known to be gone
        assert containers_named(instance.container_name)
        # Asking again changes nothing.
        assert client.delete(f"/api/v1/instances/{instance.pk}/").status_code == 202
        assert instance.events.filter(to_state="destroying").count() == 1
    finally:
        host.start()
    assert rental_destroy(instance.pk) == "destroyed"
    instance.refresh_from_db()
    assert instance.state == "destroyed"
    assert containers_named(instance.container_name) == []
    assert live_gpus(instance) == 0
    assert Hold.objects.get(pk=rental.hold_id).captured == hold.captured  # nothing more


def test_the_sweep_queues_only_work_that_no_worker_is_doing(funded_team, machine):
    instance = rent(key_client(funded_team), machine)
    now = timezone.now()
    old = now - work.SWEEP_GRACE - timedelta(seconds=1)

    def due(**fields) -> bool:
        Instance.objects.filter(pk=instance.pk).update(**fields)
        return work.work_due().filter(pk=instance.pk).exists()

    assert not due(state="running", lease_expires_at=None, work_due_at=old)  # nothing to do
    assert due(state="launching", lease_expires_at=None, work_due_at=old)
    assert due(state="stopping", lease_expires_at=now - timedelta(seconds=1), work_due_at=old)
    assert due(state="destroying", lease_expires_at=None, work_due_at=None)
    # A worker holds it; or a task was queued a moment ago, or a retry is not due yet.
    assert not due(state="launching", lease_expires_at=now + work.LEASE, work_due_at=old)
    assert not due(state="launching", lease_expires_at=None, work_due_at=now)
    assert not due(
        state="launching", lease_expires_at=None, work_due_at=now + timedelta(seconds=60)
    )


def test_a_stop_asked_for_during_a_pull_waits_for_the_launcher_and_no_container_runs(
    funded_team, machine
):
    """The launcher holds the lease while it pulls; the stop is refused the lease ("busy")
    until the launcher, at its next progress report, sees the stop and lets go. Then the stop
    finds no container (none was made) and gives the GPU back."""
    gate, pulling = threading.Event(), threading.Event()

    def hold_blobs(path: str) -> None:
        if "/blobs/" in path:
            pulling.set()
            gate.wait(timeout=60)

    registry = Registry("gpumkt/busybox:latest", on_request=hold_blobs)
    client = key_client(funded_team)
    try:
        # Rent without running the launch here: it runs in a thread below, as a worker would.
        with _no_broker_sends():
            instance = rent(client, machine, image=registry.image)
        assert instance.state == "launching"
        outcome: list[scheduler.WorkOutcome] = []

        def launch() -> None:
            try:
                outcome.append(scheduler.instance_launch(instance_id=instance.pk))
            finally:
                connection.close()

        launcher = threading.Thread(target=launch)
        launcher.start()
        assert pulling.wait(timeout=60), "the launch never reached the registry"
        # Docker's "Pulling fs layer" line comes as the layer is asked for; once the launcher
        # has reported it, no other line comes until the registry answers. Asked for earlier,
        # the stop can meet the launcher letting go at that report, and take the lease at once.
        until(lambda: _status(instance).startswith("Pulling image: 0/"))
        response = client.post(f"/api/v1/instances/{instance.pk}/stop/")
        assert response.status_code == 202 and response.json()["state"] == "stopping"
        assert scheduler.instance_stop(instance_id=instance.pk).state == "busy"
        assert live_gpus(instance) == 1
        gate.set()
        launcher.join(timeout=120)
        assert outcome and outcome[0].state == "stopping"
        assert rental_stop(instance.pk) == "stopped"
    finally:
        gate.set()
        registry.close()
    instance.refresh_from_db()
    assert instance.state == "stopped" and instance.container_id == ""
    assert containers_named(instance.container_name) == []
    assert live_gpus(instance) == 0


def _status(instance: Instance) -> str:
    return Instance.objects.values_list("status_message", flat=True).get(pk=instance.pk)


class _no_broker_sends:
    """Tasks queued inside are dropped: the test runs the work itself."""

    def __enter__(self):
        self._saved = work._enqueuers.copy()
        for state in self._saved:
            work._enqueuers[state] = lambda instance_id, countdown: None

    def __exit__(self, *exc):
        work._enqueuers.update(self._saved)


# --- a real worker, killed ----------------------------------------------------------------


def _database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def _start_worker(log: Path, *, beat: bool) -> subprocess.Popen:
    """A Celery worker (and beat, with the production schedule) in a process group of its
    own, on the test's database and broker, tagging its containers for clean-up."""
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "CONTAINER_EXTRA_LABELS": sim_container_label(),
        "PYTHONPATH": str(ROOT),
    }
    argv = [
        sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--loglevel", "info",
        "--concurrency", "1", "--without-gossip", "--without-mingle",
        "--hostname", f"test-{uuid.uuid4().hex[:8]}@%h",
    ]  # fmt: skip
    if beat:
        argv += ["--beat", "--schedule", str(log.with_suffix(".beat"))]
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill(worker: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)


def test_a_launch_whose_worker_is_killed_is_finished_by_another_within_a_minute(
    funded_team, machine, tmp_path
):
    gate, pulling = threading.Event(), threading.Event()

    def hold_blobs(path: str) -> None:
        if "/blobs/" in path:
            pulling.set()
            gate.wait(timeout=120)

    registry = Registry("gpumkt/busybox:latest", on_request=hold_blobs)
    celery_app.control.purge()
    first = _start_worker(tmp_path / "first.log", beat=False)
    second = None
    try:
        # Queued on the broker this time, for the worker (Celery reads its settings under the
        # CELERY_ namespace, so that is the name to change).
        celery_app.conf.CELERY_TASK_ALWAYS_EAGER = False
        try:
            instance = rent(key_client(funded_team), machine, image=registry.image)
        finally:
            celery_app.conf.CELERY_TASK_ALWAYS_EAGER = True
        # The first worker is pulling (its lease renewed meanwhile) when it dies.
        assert pulling.wait(timeout=60), (tmp_path / "first.log").read_text()[-3000:]
        leased = Instance.objects.get(pk=instance.pk)
        assert leased.state == "launching" and leased.lease_token
        _kill(first)
        killed_at = time.monotonic()
        gate.set()
        second = _start_worker(tmp_path / "second.log", beat=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            instance.refresh_from_db()
            if instance.state != "launching":
                break
            time.sleep(0.5)
        recovered_in = time.monotonic() - killed_at
        logs = (tmp_path / "second.log").read_text()[-4000:]
        assert instance.state == "running", f"{instance.status_message}\n{logs}"
        print(f"launch finished by another worker {recovered_in:.1f} s after the kill")
        assert recovered_in < 90, logs  # a 30 s lease, a 30 s grace, a 15 s sweep
    finally:
        gate.set()
        _kill(first)
        if second is not None:
            _kill(second)
        registry.close()
    assert instance.attempts == 2  # the killed one, and the one that finished
    assert len(containers_named(instance.container_name)) == 1
    assert running(instance.container_id)
    assert live_gpus(instance) == 1
    assert list(instance.events.values_list("to_state", flat=True)) == ["launching", "running"]
    assert settings.CELERY_TASK_ACKS_LATE
