"""Rentals are charged only while their machine is in service: every way out pauses both
clocks, through the real signal path (hosts → marketplace receiver), and the way back resumes
them."""

from __future__ import annotations

import pytest

from hosts import services as host_services
from hosts import tasks
from hosts.models import MachineStatus
from marketplace.models import Rental, Role
from tests.conftest import client_for, key_client, sim_container_label
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund, machine_for, remove_containers

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _label_test_containers(settings):
    key, value = sim_container_label().split("=", 1)
    settings.CONTAINER_EXTRA_LABELS = {key: value}
    yield
    remove_containers(sim_container_label())


@pytest.fixture
def provider_team(db):
    team = TeamFactory(name="GPU Provider Inc")
    add_member(team, UserFactory(username="provider"), Role.OWNER)
    return team


def rent_one(renter_team, machine) -> Rental:
    response = key_client(renter_team).post(
        "/api/v1/instances/",
        {"machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
         "duration_hours": 2, "disk_gb": 5, "entrypoint": "sleep", "args": ["600"]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    rental = Rental.objects.get(instance_id=response.json()["id"])
    assert rental.instance.state == "running", rental.instance.status_message
    return rental


def assert_paused(rental: Rental) -> tuple[int, int]:
    rental.refresh_from_db()
    assert rental.gpu_clock_since is None and rental.storage_clock_since is None
    return rental.gpu_seconds, rental.storage_seconds


def assert_running(rental: Rental, frozen: tuple[int, int]) -> None:
    rental.refresh_from_db()
    assert rental.gpu_clock_since is not None and rental.storage_clock_since is not None
    assert (rental.gpu_seconds, rental.storage_seconds) == frozen  # nothing billed meanwhile


def test_a_changed_host_key_pauses_charges_until_a_key_is_pinned(
    team, owner, sim_host_factory, provider_team
):
    fund(team)
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    rental = rent_one(team, machine)
    host.rotate_host_key()
    host_services.machine_heartbeat(machine_id=machine.pk)  # meets the new key
    machine.refresh_from_db()
    assert machine.status == MachineStatus.KEY_MISMATCH
    frozen = assert_paused(rental)
    # The provider checks and pins the new key: pending (still paused), then probed online.
    host_services.machine_confirm_host_key(
        machine_id=machine.pk, fingerprint=host.host_key_fingerprint
    )
    assert_paused(rental)
    machine = host_services.machine_probe(machine_id=machine.pk)
    assert machine.status == MachineStatus.ONLINE
    assert_running(rental, frozen)


def test_an_error_pauses_charges_and_recovery_resumes_them(
    team, owner, sim_host_factory, provider_team, settings
):
    settings.HOST_PROBE_FAILURES = 1
    settings.HOST_PROBE_RETRY_SECONDS = 0
    fund(team)
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    host_services.machine_probe(machine_id=machine.pk)  # a first clean probe: in service
    rental = rent_one(team, machine)
    host.set_driver_failed(True)
    try:
        machine = host_services.machine_probe(machine_id=machine.pk)
        assert machine.status == MachineStatus.ERROR
        frozen = assert_paused(rental)
        # The provider sees the rented GPU is hit by the outage, through the API too.
        api = key_client(provider_team)
        gpus = api.get(f"/api/v1/machines/{machine.pk}/").json()["gpus"]
        assert [gpu["state"] for gpu in gpus] == ["rented"]
    finally:
        host.set_driver_failed(False)
    assert tasks.heartbeat(machine.pk) == MachineStatus.ONLINE
    assert_running(rental, frozen)


def test_offline_then_a_key_mismatch_then_back_pauses_once_and_resumes_once(
    team, owner, sim_host_factory, provider_team, settings
):
    settings.HOST_HEARTBEAT_MISSES = 1
    fund(team)
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    rental = rent_one(team, machine)
    host.stop()
    try:
        host_services.machine_heartbeat(machine_id=machine.pk)
        frozen = assert_paused(rental)
        host.rotate_host_key()  # it comes back reinstalled, with a new key
    finally:
        host.start()
    host_services.machine_heartbeat(machine_id=machine.pk)
    machine.refresh_from_db()
    assert machine.status == MachineStatus.KEY_MISMATCH  # offline → key mismatch: no resume
    assert assert_paused(rental) == frozen
    host_services.machine_confirm_host_key(
        machine_id=machine.pk, fingerprint=host.host_key_fingerprint
    )
    host_services.machine_probe(machine_id=machine.pk)
    assert_running(rental, frozen)


def test_the_provider_console_shows_the_rented_gpu_and_the_fleet(
    client, team, owner, sim_host_factory, provider_team
):
    fund(team)
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    rent_one(team, machine)
    provider = provider_team.memberships.get().user
    client_for(client, provider, provider_team)
    page = client.get("/machines/").content.decode()
    assert "1 rented · 1 free" in page and "1 online" in page
