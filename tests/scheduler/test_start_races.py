"""Starting a stopped instance again, with the reconcile task and the expiry sweep running in
the middle of it.

``instance_start`` commits the GPUs it takes back before it runs ``docker start`` over SSH (no
row lock is held across a host command), so for that while the instance is still "stopped" but
holds GPUs and its container runs. To hold the start in exactly that window, the simulated host
gets a ``docker`` on its PATH that runs the real one and then, for ``docker start``, waits until
the test lets it return; everything else (SSH, Docker, PostgreSQL, our services) is real.
"""

from __future__ import annotations

import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from marketplace.models import Offer, Rental
from marketplace.tasks import expiry_sweep
from scheduler import services as scheduler
from scheduler.models import GpuAllocation, Instance
from tests.conftest import key_client
from tests.marketplace.conftest import docker_inspect, machine_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

# Exits at once on `docker stop` (a bare `sleep` as PID 1 ignores SIGTERM for 10 s).
QUICK_STOP = ["-c", "trap 'exit 0' TERM; echo up; while :; do sleep 1; done"]
RENT = {
    "num_gpus": 1, "image": "gpumkt/busybox:latest", "duration_hours": 2, "disk_gb": 10,
    "entrypoint": "sh", "args": QUICK_STOP, "ports": [],
}  # fmt: skip


def rented_then_stopped(client, machine) -> Instance:
    response = client.post("/api/v1/instances/", {**RENT, "machine_id": machine.pk}, format="json")
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == "running", instance.status_message
    assert client.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    instance.refresh_from_db()
    assert instance.state == "stopped" and live_gpus(instance) == 0
    assert not running(instance.container_id)
    return instance


def live_gpus(instance: Instance) -> int:
    return GpuAllocation.objects.filter(instance=instance, released_at=None).count()


def running(container: str) -> bool:
    return docker_inspect(container)["State"]["Running"]


class HeldStart:
    """``scheduler.instance_start`` in a thread, held just after its ``docker start`` ran on
    the host, before it returns to the service."""

    def __init__(self, host, instance_id: int):
        self.bin = Path(host.root) / "bin"
        self.hold = Path(host.root) / "hold-docker-start"
        self.reached = Path(host.root) / "docker-start-reached"
        self.instance_id = instance_id
        self.result: Instance | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._start)

    def __enter__(self) -> HeldStart:
        self.hold.touch()
        wrapper = self.bin / "docker"
        wrapper.write_text(
            "#!/bin/sh\n"
            f'{shutil.which("docker")} "$@"; rc=$?\n'
            'if [ "$1" = start ]; then\n'
            f"  touch {self.reached}\n"
            f"  while [ -e {self.hold} ]; do sleep 0.05; done\n"
            "fi\n"
            "exit $rc\n"
        )
        wrapper.chmod(0o755)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.reached.exists():
            assert self.thread.is_alive(), f"the start ended before docker start: {self.error!r}"
            assert time.monotonic() < deadline, "docker start never ran"
            time.sleep(0.05)
        return self

    def finish(self) -> None:
        self.hold.unlink(missing_ok=True)
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()

    def __exit__(self, *exc) -> None:
        self.finish()
        (self.bin / "docker").unlink(missing_ok=True)
        self.reached.unlink(missing_ok=True)

    def _start(self) -> None:
        try:
            self.result = scheduler.instance_start(instance_id=self.instance_id)
        except BaseException as error:  # noqa: BLE001 (reported to the test)
            self.error = error
        finally:
            connection.close()


def test_reconcile_during_a_start_leaves_its_gpus_and_container_alone(
    funded_team, sim_host_factory, provider_team
):
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    instance = rented_then_stopped(key_client(funded_team), machine)
    with HeldStart(host, instance.pk) as start:
        # The window: GPUs taken back and committed, container started, state not moved yet.
        instance.refresh_from_db()
        assert instance.state == "stopped" and live_gpus(instance) == 1
        assert running(instance.container_id)
        assert scheduler.machine_reconcile(machine_id=machine.pk) == 0
        assert live_gpus(instance) == 1 and running(instance.container_id)
        start.finish()
    assert start.error is None, start.error
    instance.refresh_from_db()
    assert instance.state == "running" and start.result.state == "running"
    assert live_gpus(instance) == 1
    assert running(instance.container_id)
    assert (
        Offer.objects.get(machine=machine, all_free=True).num_gpus == 0
    )  # not offered to anyone else
    assert scheduler.machine_reconcile(machine_id=machine.pk) == 0  # and it stays that way
    assert instance.events.last().reason == "Started by the renter"


def test_expiry_during_a_start_stops_the_container_and_the_start_is_refused(
    funded_team, sim_host_factory, provider_team
):
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    instance = rented_then_stopped(key_client(funded_team), machine)
    with HeldStart(host, instance.pk) as start:
        now = timezone.now()
        Rental.objects.filter(instance=instance).update(
            starts_at=now - timedelta(hours=2), ends_at=now - timedelta(seconds=1)
        )
        assert expiry_sweep() == 1
        instance.refresh_from_db()
        assert instance.state == "expired"
        # The container the start had just started is stopped, so its GPUs are free.
        assert not running(instance.container_id)
        assert live_gpus(instance) == 0
        start.finish()
    assert isinstance(start.error, scheduler.InvalidTransition), start.error
    instance.refresh_from_db()
    assert instance.state == "expired" and live_gpus(instance) == 0
    assert not running(instance.container_id)  # the start did not leave it running either


def test_reconcile_frees_the_gpus_of_a_start_that_died_midway(
    funded_team, sim_host_factory, provider_team
):
    """A start whose worker died after taking the GPUs back (the transaction instance_start
    commits first) does not hold them for ever: once START_LEASE has passed, reconcile gives
    them back."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    instance = rented_then_stopped(key_client(funded_team), machine)
    with transaction.atomic():
        Instance.objects.select_for_update().get(pk=instance.pk)
        scheduler.gpu_allocation_reclaim(instance=instance)
    assert scheduler.machine_reconcile(machine_id=machine.pk) == 0  # under way: left alone
    assert live_gpus(instance) == 1
    GpuAllocation.objects.filter(instance=instance, released_at=None).update(
        created_at=timezone.now() - scheduler.START_LEASE - timedelta(seconds=1)
    )
    assert scheduler.machine_reconcile(machine_id=machine.pk) == 1
    instance.refresh_from_db()
    assert instance.state == "stopped" and live_gpus(instance) == 0
    assert instance.events.last().reason == (
        "Its container is confirmed stopped; its GPUs are free again"
    )
    started = scheduler.instance_start(instance_id=instance.pk)  # and it can be started again
    assert started.state == "running" and live_gpus(instance) == 1
    assert running(instance.container_id)
