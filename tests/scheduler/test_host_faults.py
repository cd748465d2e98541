"""A host whose Docker does not answer: nothing is recorded that it did not do.

The simulated host gets a ``docker`` first on its sessions' PATH that answers as a stopped
daemon does ("Cannot connect to the Docker daemon", exit 1), always or one call in three;
everything else (SSH, the real Docker behind it, PostgreSQL, our services) is real. The
container of a destroy the host did not confirm keeps running, so its GPU must not be rented
to anyone until Docker itself says the container is gone.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from hosts.services import machine_heartbeat, offline_bound_seconds
from marketplace.models import Offer, Rental, Role
from scheduler import services as scheduler
from scheduler.models import GpuAllocation, Instance
from tests.billing.ledger_checks import assert_ledger_consistent
from tests.conftest import key_client, sim_container_label
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import containers_named, docker, fund, machine_for
from tests.marketplace.test_rental_lifecycle import live_gpus, rent, rented

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

DAEMON_DOWN = (
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
    "Is the docker daemon running?"
)


class DockerRefuses:
    """While active, the host's ``docker`` answers as a daemon that is down: every call, or
    (``one_in_three``) every third one, counted across calls."""

    def __init__(self, host, *, one_in_three: bool = False):
        self.wrapper = Path(host.root) / "bin" / "docker"
        self.counter = Path(host.root) / "docker-calls"
        self.one_in_three = one_in_three

    def __enter__(self) -> DockerRefuses:
        self.counter.write_text("0")
        refuse = f"echo '{DAEMON_DOWN}' >&2; exit 1"
        if self.one_in_three:
            body = (
                f"n=$(cat {self.counter}); echo $((n + 1)) > {self.counter}\n"
                f'if [ $((n % 3)) -eq 0 ]; then {refuse}; fi\nexec {shutil.which("docker")} "$@"\n'
            )
        else:
            body = f"{refuse}\n"
        self.wrapper.write_text("#!/bin/sh\n" + body)
        self.wrapper.chmod(0o755)
        return self

    def __exit__(self, *exc) -> None:
        self.wrapper.unlink(missing_ok=True)
        self.counter.unlink(missing_ok=True)


def container_running(ref: str) -> bool:
    found = docker("inspect", ref, check=False)
    return found.returncode == 0 and json.loads(found.stdout)[0]["State"]["Running"]


def other_funded_team():
    team = TeamFactory(name="Other Renters")
    add_member(team, UserFactory(username="other-owner"), Role.OWNER)
    fund(team)
    return team


def test_a_destroy_the_hosts_docker_did_not_confirm_keeps_its_gpu_from_everyone(
    funded_team, sim_host_factory, provider_team
):
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    client = key_client(funded_team)
    instance = rented(client, machine)
    other = key_client(other_funded_team())

    with DockerRefuses(host):
        assert client.delete(f"/api/v1/instances/{instance.pk}/").status_code in (200, 202, 204)
        instance.refresh_from_db()
        # Not "destroyed": the host has not said so, and the container does run.
        assert instance.state == "destroying", instance.status_message
        assert "has not answered" in instance.status_message
        assert container_running(instance.container_id)
        assert live_gpus(instance) == 1
        # The renter stopped paying when asking; the GPU stays out of everyone's reach.
        rental = Rental.objects.get(instance=instance)
        assert rental.gpu_clock_since is None
        refused = rent(other, machine)
        assert refused.status_code == 409, refused.content
        # Tried again while Docker still does not answer: still waiting, nothing released.
        assert scheduler.instance_destroy(instance_id=instance.pk).state == "retry"
        instance.refresh_from_db()
        assert instance.state == "destroying" and live_gpus(instance) == 1
        # Reconcile cannot list the containers either: it changes nothing.
        with pytest.raises(Exception):  # noqa: B017 (whatever the host raised)
            scheduler.machine_reconcile(machine_id=machine.pk)
        assert live_gpus(instance) == 1

    # Docker answers again: the next try removes the container and only then frees the GPU.
    assert scheduler.instance_destroy(instance_id=instance.pk).state == "destroyed"
    assert not containers_named(instance.container_name)
    assert live_gpus(instance) == 0
    assert instance.events.last().reason == "Destroyed: the container and its data are removed"
    assert rent(other, machine).status_code == 201
    assert_ledger_consistent()


def test_a_stop_the_hosts_docker_did_not_confirm_stays_stopping(
    funded_team, sim_host_factory, provider_team
):
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    client = key_client(funded_team)
    instance = rented(client, machine)
    with DockerRefuses(host):
        assert client.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
        instance.refresh_from_db()
        assert instance.state == "stopping" and live_gpus(instance) == 1
        assert container_running(instance.container_id)
    assert scheduler.instance_stop(instance_id=instance.pk).state == "stopped"
    assert not container_running(instance.container_id)
    assert live_gpus(instance) == 0


def test_with_docker_failing_one_call_in_three_no_gpu_has_two_tenants(
    funded_team, sim_host_factory, provider_team
):
    """Destroy, retried by hand as the work sweep would, and a second team renting the GPU
    after every try: at no step does the second team get it while the first container runs."""
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    client = key_client(funded_team)
    instance = rented(client, machine)
    other = key_client(other_funded_team())
    with DockerRefuses(host, one_in_three=True):
        client.delete(f"/api/v1/instances/{instance.pk}/")
        for _ in range(12):
            instance.refresh_from_db()
            if instance.state == "destroyed":
                break
            assert live_gpus(instance) == 1
            assert container_running(instance.container_id)
            refused = rent(other, machine)
            assert refused.status_code == 409, refused.content
            scheduler.instance_destroy(instance_id=instance.pk)
        instance.refresh_from_db()
        assert instance.state == "destroyed", instance.status_message
        # Confirmed by Docker, then given back: the container is gone for real.
        assert live_gpus(instance) == 0
    assert not containers_named(instance.container_name)
    assert rent(other, machine).status_code == 201
    assert_ledger_consistent()


def test_reconcile_removes_leftover_containers_in_one_pass_and_says_why(
    funded_team, sim_host_factory, provider_team, caplog
):
    """An exited container of a destroyed rental carrying the platform's labels for this
    machine: one reconcile pass removes it and logs why. One whose instance this platform does
    not know is reported and left (it may be another installation's); a live rental's stays."""
    host = sim_host_factory(gpus=2)
    machine = machine_for(host, provider_team)
    client = key_client(funded_team)
    kept = rented(client, machine)
    destroyed = rented(client, machine)
    assert client.delete(f"/api/v1/instances/{destroyed.pk}/").status_code in (200, 202, 204)
    destroyed.refresh_from_db()
    assert destroyed.state == "destroyed"

    stray_uuid = str(uuid.uuid4())
    labels = ["gpumkt.platform=1", f"gpumkt.machine={machine.pk}", sim_container_label()]
    made = []
    for name, instance_uuid in [
        (destroyed.container_name, str(destroyed.uuid)),  # as if a removal had been lost
        (f"gpumkt-stray-{stray_uuid[:8]}", stray_uuid),
    ]:
        argv = ["create", "--name", name, "--label", f"gpumkt.instance={instance_uuid}"]
        for label in labels:
            argv += ["--label", label]
        made.append(docker(*argv, "gpumkt/busybox:latest", "true").stdout.strip())
    leftover, stray = made
    try:
        with caplog.at_level(logging.WARNING, logger="scheduler.services.reconcile"):
            scheduler.machine_reconcile(machine_id=machine.pk)
        assert docker("inspect", leftover, check=False).returncode != 0, "left on the host"
        assert docker("inspect", stray, check=False).returncode == 0, "another's, removed"
        messages = [r.getMessage() for r in caplog.records]
        assert any(
            "removed leftover" in m and f"instance {destroyed.uuid} was destroyed" in m
            for m in messages
        ), messages
        assert any("belongs to no instance" in m and stray_uuid in m for m in messages), messages
        assert container_running(kept.container_id)
        kept.refresh_from_db()
        assert kept.state == "running"
    finally:
        docker("rm", "-f", stray, check=False)


def test_a_docker_outage_is_seen_not_charged_and_the_killed_container_starts_again(
    funded_team, sim_host_factory, provider_team
):
    """The host's Docker stops (its containers die with it) and comes back: the machine is
    degraded meanwhile (not rentable), the instance unknown (not running) and not charged;
    afterwards the container runs again on its GPU and the GPU clock runs from then on."""
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    client = key_client(funded_team)
    instance = rented(client, machine)
    gpu_ids = set(
        GpuAllocation.objects.filter(instance=instance, released_at=None).values_list(
            "gpu_id", flat=True
        )
    )
    charged_since = Rental.objects.get(instance=instance).gpu_clock_since
    assert charged_since is not None

    with DockerRefuses(host):
        docker("kill", instance.container_id)  # what a daemon going down does to it
        machine = machine_heartbeat(machine_id=machine.pk)
        assert machine.status == "degraded"
        assert "Docker Engine does not answer" in machine.status_detail
        instance.refresh_from_db()
        assert instance.state == "unknown"
        assert "Docker Engine does not answer" in instance.status_message
        outage_from = instance.state_changed_at
        rental = Rental.objects.get(instance=instance)
        assert rental.gpu_clock_since is None  # not charged while the host cannot run it
        assert rental.gpu_seconds == int((outage_from - charged_since).total_seconds())
        assert Offer.objects.get(machine=machine, all_free=True).num_gpus == 0  # nobody can rent it
        assert live_gpus(instance) == 1  # and it keeps its GPU

    machine = machine_heartbeat(machine_id=machine.pk)
    assert machine.status == "online"
    instance.refresh_from_db()
    assert instance.state == "running", instance.status_message
    assert instance.status_message.startswith("Started again: the host stopped its container")
    assert container_running(instance.container_id)
    assert gpu_ids == set(
        GpuAllocation.objects.filter(instance=instance, released_at=None).values_list(
            "gpu_id", flat=True
        )
    )
    rental = Rental.objects.get(instance=instance)
    # Charged up to the outage, and again from the moment it runs again: not in between.
    assert rental.gpu_clock_since >= instance.state_changed_at - timedelta(seconds=1)
    assert rental.gpu_seconds == int((outage_from - charged_since).total_seconds())
    assert_ledger_consistent()


def test_a_container_that_exited_before_the_outage_stays_exited(
    funded_team, sim_host_factory, provider_team
):
    """Its host answers again, and its container had finished well before the host could
    have stopped answering: the renter's command ended on its own, so it is exited (as
    charged today), not started again."""
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    instance = rented(key_client(funded_team), machine)
    docker("stop", instance.container_id)  # exits 0 on TERM (QUICK_STOP)
    scheduler.machine_instances_unknown(machine_id=machine.pk, reason="missed 3 heartbeats")
    # It became unknown long after it finished: later than any unnoticed outage could reach.
    later = timezone.now() + timedelta(seconds=offline_bound_seconds() + 60)
    Instance.objects.filter(pk=instance.pk).update(state_changed_at=later)
    scheduler.machine_reconcile(machine_id=machine.pk)
    instance.refresh_from_db()
    assert instance.state == "exited", instance.status_message
    assert instance.exit_code == 0
    assert not container_running(instance.container_id)
