"""A rental's life on simulated hosts, where it goes wrong: an unreachable or re-keyed host at
the end, two workers launching at once, a container killed behind our back, GPUs taken while
stopped, short credit, the machine's end date and maintenance, and the clocks at the end."""

from __future__ import annotations

import subprocess
import threading
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from billing.credits import credit_grant
from billing.models import Hold
from billing.selectors import team_balance
from hosts import services as host_services
from hosts.models import Machine, MaintenanceWindow
from marketplace.models import Offer, Rental, Role
from marketplace.rentals.extending import rental_extend
from marketplace.services.pricing import rental_quote
from marketplace.tasks import expiry_sweep
from scheduler import services as scheduler
from scheduler.models import GpuAllocation, Instance, InstanceEvent
from scheduler.tasks import machines_reconcile
from scheduler.work import LEASE
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import containers_named, docker_inspect, fund, machine_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

# Exits at once on `docker stop` (a bare `sleep` as PID 1 ignores SIGTERM for 10 s).
QUICK_STOP = ["-c", "trap 'exit 0' TERM; echo up; while :; do sleep 1; done"]
RENT = {
    "num_gpus": 1, "image": "gpumkt/busybox:latest", "duration_hours": 2, "disk_gb": 10,
    "entrypoint": "sh", "args": QUICK_STOP, "ports": [],
}  # fmt: skip


def rent(client, machine, **overrides):
    return client.post(
        "/api/v1/instances/", {**RENT, "machine_id": machine.pk, **overrides}, format="json"
    )


def rented(client, machine, **overrides) -> Instance:
    response = rent(client, machine, **overrides)
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == "running", instance.status_message
    return instance


def live_gpus(instance: Instance) -> int:
    return GpuAllocation.objects.filter(instance=instance, released_at=None).count()


def end_now(instance: Instance) -> None:
    """The rental period is over (its end is a second ago)."""
    now = timezone.now()
    Rental.objects.filter(instance=instance).update(
        starts_at=now - timedelta(hours=2), ends_at=now - timedelta(seconds=1)
    )


def running(container: str) -> bool:
    return docker_inspect(container)["State"]["Running"]


def test_expiry_with_the_host_down_keeps_the_gpus_until_reconcile_stops_the_container(
    funded_team, sim_host_factory, provider_team
):
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    instance = rented(key_client(funded_team), machine)
    end_now(instance)
    host.stop()
    try:
        assert expiry_sweep() == 1
        instance.refresh_from_db()
        # The rental is over (and settled), but the container may still run on the GPU: the
        # GPU stays reserved and is not offered to anyone.
        assert instance.state == "expired"
        assert "GPUs stay reserved" in instance.status_message
        assert Rental.objects.get(instance=instance).settled_at is not None
        assert live_gpus(instance) == 1
        assert Offer.objects.get(machine=machine, all_free=True).num_gpus == 0
        assert running(instance.container_id)  # the host was down: nobody stopped it
        assert machines_reconcile() == 1  # the machine is still watched
        assert live_gpus(instance) == 1  # its host did not answer: nothing released
    finally:
        host.start()
    machines_reconcile()
    instance.refresh_from_db()
    assert not running(instance.container_id)
    assert live_gpus(instance) == 0
    assert Offer.objects.get(machine=machine, all_free=True).num_gpus == 1
    last = instance.events.last()
    assert (last.from_state, last.to_state) == ("expired", "expired")
    assert (
        last.reason
        == "Its container was still running on the host; stopped it; its GPUs are free again"
    )
    assert machines_reconcile() == 0  # nothing left to watch on it


def test_reconcile_stops_a_container_whose_instance_ended(
    funded_team, sim_host_factory, provider_team
):
    """A stopped instance's container that runs again (started by hand on the host) is
    stopped: its GPUs went back to the market."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    client = key_client(funded_team)
    instance = rented(client, machine)
    assert client.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    subprocess.run(["docker", "start", instance.container_id], check=True, capture_output=True)
    other = rented(client, machine)  # the GPU is someone else's now; keeps it watched
    assert machines_reconcile() == 1
    instance.refresh_from_db()
    assert instance.state == "stopped" and not running(instance.container_id)
    assert (
        instance.events.last().reason == "Its container was still running on the host; stopped it"
    )
    assert running(other.container_id)


def test_one_flagged_machine_does_not_stop_the_expiry_sweep(
    funded_team, sim_host_factory, provider_team
):
    client = key_client(funded_team)
    good_machine = machine_for(sim_host_factory(gpus=1), provider_team)
    good = rented(client, good_machine)
    rekeyed_host = sim_host_factory(gpus=1)
    rekeyed = rented(client, machine_for(rekeyed_host, provider_team))
    end_now(good)
    end_now(rekeyed)  # the newest: the sweep meets it first
    rekeyed_host.rotate_host_key()
    assert expiry_sweep() == 2
    good.refresh_from_db()
    rekeyed.refresh_from_db()
    assert good.state == "expired" and live_gpus(good) == 0 and not running(good.container_id)
    assert rekeyed.state == "expired" and live_gpus(rekeyed) == 1
    assert "not the pinned key" in rekeyed.status_message
    assert Machine.objects.get(pk=rekeyed.machine_id).status == "key_mismatch"


def test_two_workers_launching_at_once_make_one_container(funded_team, machine):
    instance = rented(key_client(funded_team), machine)
    # Back to a first launch that no worker has picked up yet.
    subprocess.run(["docker", "rm", "-f", instance.container_id], capture_output=True, check=True)
    Instance.objects.filter(pk=instance.pk).update(state="launching", container_id="", attempts=0)
    start = threading.Barrier(2)
    outcomes: list[scheduler.WorkOutcome] = []

    def launch():
        try:
            start.wait()
            outcomes.append(scheduler.instance_launch(instance_id=instance.pk))
        finally:
            connection.close()

    workers = [threading.Thread(target=launch) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert sorted(o.state for o in outcomes) == ["busy", "running"]
    assert len(containers_named(instance.container_name)) == 1
    instance.refresh_from_db()
    assert instance.state == "running" and running(instance.container_id)
    assert instance.attempts == 1 and instance.lease_token == ""
    started = instance.events.filter(from_state="launching", to_state="running")
    assert started.count() == 2  # the rent's own launch, and this one; not a third


def test_a_claim_left_by_a_dead_worker_expires(funded_team, machine):
    instance = rented(key_client(funded_team), machine)
    Instance.objects.filter(pk=instance.pk).update(
        state="launching", lease_token="dead-worker", lease_expires_at=timezone.now() + LEASE
    )
    assert scheduler.instance_launch(instance_id=instance.pk).state == "busy"
    Instance.objects.filter(pk=instance.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    outcome = scheduler.instance_launch(instance_id=instance.pk)
    assert outcome.state == "running" and outcome.container_id == instance.container_id
    assert len(containers_named(instance.container_name)) == 1  # adopted, not made twice


def test_the_clocks_stop_at_the_end_of_the_rental(funded_team, machine):
    instance = rented(key_client(funded_team), machine, duration_hours=1)
    rental = instance.rental
    now = timezone.now()
    ends = now - timedelta(seconds=30)  # the sweep comes 30 s after the end
    Rental.objects.filter(pk=rental.pk).update(
        starts_at=ends - timedelta(hours=1), ends_at=ends,
        gpu_clock_since=ends - timedelta(hours=1), storage_clock_since=ends - timedelta(hours=1),
    )  # fmt: skip
    rental.refresh_from_db()
    assert rental.gpu_seconds_at(now) == 3600
    assert rental.storage_seconds_at(now + timedelta(days=3)) == 3600
    hold = Hold.objects.get(pk=rental.hold_id)
    assert expiry_sweep() == 1
    rental.refresh_from_db()
    assert (rental.gpu_seconds, rental.storage_seconds) == (3600, 3600)
    hold.refresh_from_db()
    # Exactly what was quoted and held for the hour: nothing for the 30 s after the end.
    assert hold.captured == rental_quote(machine=machine, gpu_count=1, disk_gb=10, hours=1).total
    assert hold.captured == hold.amount


def test_an_extension_before_the_sweep_counts_the_time_past_the_old_end(funded_team, machine):
    instance = rented(key_client(funded_team), machine, duration_hours=1)
    now = timezone.now()
    Rental.objects.filter(instance=instance).update(
        starts_at=now - timedelta(hours=1, seconds=30), ends_at=now - timedelta(seconds=30),
        gpu_clock_since=now - timedelta(hours=1, seconds=30),
    )  # fmt: skip
    rental = Rental.objects.get(instance=instance)
    assert rental.gpu_seconds_at(now) == 3600
    rental_extend(rental=rental, hours=1)
    rental.refresh_from_db()
    assert rental.gpu_seconds_at(now) == 3630


def test_reconcile_notices_a_container_killed_behind_our_back(funded_team, machine):
    instance = rented(key_client(funded_team), machine)
    subprocess.run(["docker", "kill", instance.container_id], capture_output=True, check=True)
    assert machines_reconcile() >= 1  # the beat task: fans out one reconcile per machine
    instance.refresh_from_db()
    assert instance.state == "exited"
    event = instance.events.last()
    assert (event.from_state, event.to_state) == ("running", "exited")
    assert event.reason.startswith("The container exited (Exited (137)")
    assert live_gpus(instance) == 1  # exited on its own: still the renter's GPU


def test_start_is_409_when_its_gpus_were_taken(funded_team, sim_host_factory, provider_team):
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    client = key_client(funded_team)
    instance = rented(client, machine)
    assert client.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    other_team = TeamFactory(name="Other renter")
    add_member(other_team, UserFactory(username="other"), Role.OWNER)
    fund(other_team)
    rented(key_client(other_team), machine)
    response = client.post(f"/api/v1/instances/{instance.pk}/start/")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "gpus_taken"
    instance.refresh_from_db()
    assert instance.state == "stopped" and live_gpus(instance) == 0
    assert not running(instance.container_id)


def test_extend_is_402_when_short_and_refused_past_the_machine_end_date(
    team, owner, sim_host_factory, provider_team
):
    machine = machine_for(
        sim_host_factory(gpus=1), provider_team, end_date=timezone.now() + timedelta(hours=5)
    )
    fund(team, dollars=2)  # $0.50 an hour: 2 hours are held, about $1 is left
    client = key_client(team)
    instance = rented(client, machine, duration_hours=2)
    rental = instance.rental
    hold_before, ends_before = Hold.objects.get(pk=rental.hold_id).amount, rental.ends_at
    short = client.post(f"/api/v1/instances/{instance.pk}/extend/", {"hours": 2.5}, format="json")
    assert short.status_code == 402
    assert short.json()["error"]["code"] == "insufficient_credit"
    credit_grant(team_id=team.pk, amount=50_000_000, reason="more", idempotency_key="more")
    too_long = client.post(f"/api/v1/instances/{instance.pk}/extend/", {"hours": 4}, format="json")
    assert too_long.status_code == 400
    assert "offered until" in too_long.json()["error"]["fields"]["hours"][0]
    rental.refresh_from_db()
    assert rental.ends_at == ends_before  # neither attempt changed the rental or its hold
    assert Hold.objects.get(pk=rental.hold_id).amount == hold_before
    ok = client.post(f"/api/v1/instances/{instance.pk}/extend/", {"hours": 2}, format="json")
    assert ok.status_code == 200


def test_renting_past_the_end_date_or_over_maintenance_is_refused(
    funded_team, sim_host_factory, provider_team
):
    now = timezone.now()
    machine = machine_for(
        sim_host_factory(gpus=2), provider_team, end_date=now + timedelta(hours=3)
    )
    client = key_client(funded_team)
    past_end = rent(client, machine, duration_hours=4)
    assert past_end.status_code == 400
    assert "offered until" in past_end.json()["error"]["fields"]["duration_hours"][0]
    host_services.maintenance_window_add(
        machine_id=machine.pk, starts_at=now + timedelta(hours=1), ends_at=now + timedelta(hours=2)
    )
    over_maintenance = rent(client, machine, duration_hours=1.5)
    assert over_maintenance.status_code == 400
    assert "maintenance" in over_maintenance.json()["error"]["fields"]["duration_hours"][0]
    assert Instance.objects.count() == 0 and Hold.objects.count() == 0
    assert team_balance(funded_team.pk).held == 0
    assert rent(client, machine, duration_hours=0.5).status_code == 201  # before the window
    assert MaintenanceWindow.objects.filter(machine=machine).count() == 1


def test_an_extension_into_maintenance_or_an_end_date_before_a_rental_is_refused(
    funded_team, sim_host_factory, provider_team
):
    now = timezone.now()
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    client = key_client(funded_team)
    instance = rented(client, machine, duration_hours=1)
    rental = instance.rental
    hold_before = Hold.objects.get(pk=rental.hold_id).amount
    host_services.maintenance_window_add(
        machine_id=machine.pk, starts_at=now + timedelta(hours=3), ends_at=now + timedelta(hours=4)
    )
    into = client.post(f"/api/v1/instances/{instance.pk}/extend/", {"hours": 2.5}, format="json")
    assert into.status_code == 400
    assert "maintenance from" in into.json()["error"]["fields"]["hours"][0]
    rental.refresh_from_db()
    assert rental.ends_at == instance.rental.ends_at  # nothing moved, nothing held
    assert Hold.objects.get(pk=rental.hold_id).amount == hold_before
    ok = client.post(f"/api/v1/instances/{instance.pk}/extend/", {"hours": 1.5}, format="json")
    assert ok.status_code == 200  # up to the window is fine

    # The provider cannot cut the rental short by moving the end date before its end.
    rental.refresh_from_db()
    terms = {
        "machine_id": machine.pk, "price_per_gpu_hour": machine.price_per_gpu_hour,
        "storage_price_per_gb_month": machine.storage_price_per_gb_month, "min_gpus": 1,
        "location": "US",
    }  # fmt: skip
    with pytest.raises(ValidationError) as refused:
        host_services.machine_set_terms(**terms, end_date=rental.ends_at - timedelta(minutes=1))
    assert "runs until" in refused.value.message_dict["end_date"][0]
    machine.refresh_from_db()
    assert machine.end_date is None
    host_services.machine_set_terms(**terms, end_date=rental.ends_at)  # at its end: fine
    assert Machine.objects.get(pk=machine.pk).end_date == rental.ends_at


def test_unlisting_the_machine_leaves_a_running_rental_alone(funded_team, machine):
    instance = rented(key_client(funded_team), machine)
    host_services.machine_set_listed(machine_id=machine.pk, listed=False)
    assert Offer.objects.get(machine=machine, all_free=True).rentable is False
    instance.refresh_from_db()
    assert instance.state == "running" and running(instance.container_id)
    assert live_gpus(instance) == 1
    assert Rental.objects.get(instance=instance).gpu_clock_since is not None
    assert rent(key_client(funded_team), machine).status_code == 409  # but nobody new


def test_every_transition_is_an_event_with_a_reason(funded_team, machine):
    client = key_client(funded_team)
    instance = rented(client, machine)
    client.post(f"/api/v1/instances/{instance.pk}/stop/")
    client.post(f"/api/v1/instances/{instance.pk}/start/")
    subprocess.run(["docker", "stop", instance.container_id], capture_output=True, check=True)
    machines_reconcile()
    end_now(instance)
    expiry_sweep()
    Rental.objects.filter(instance=instance).update(
        data_delete_after=timezone.now() - timedelta(seconds=1)
    )
    expiry_sweep()
    events = list(InstanceEvent.objects.filter(instance=instance))
    steps = [(e.from_state, e.to_state) for e in events]
    assert steps == [
        ("", "launching"), ("launching", "running"), ("running", "stopping"),
        ("stopping", "stopped"), ("stopped", "running"), ("running", "exited"),
        ("exited", "expired"), ("expired", "destroying"), ("destroying", "destroyed"),
    ]  # fmt: skip
    assert all(e.reason.strip() for e in events)
    assert events[-2].reason == "Data deleted after the grace period"
    # Each event starts where the one before it ended.
    assert all(a.to_state == b.from_state for a, b in zip(events, events[1:], strict=False))


def test_data_is_kept_48_hours_by_default_and_as_long_as_the_setting_says(
    funded_team, machine, settings
):
    from django.conf import settings as live_settings

    assert live_settings.DATA_GRACE_HOURS == 48
    client = key_client(funded_team)
    first = rented(client, machine)
    end_now(first)
    expiry_sweep()
    rental = Rental.objects.get(instance=first)
    assert rental.data_delete_after - rental.settled_at == timedelta(hours=48)
    settings.DATA_GRACE_HOURS = 6
    second = rented(client, machine)
    end_now(second)
    expiry_sweep()
    rental = Rental.objects.get(instance=second)
    assert rental.data_delete_after - rental.settled_at == timedelta(hours=6)


def test_the_disk_share_is_recorded_on_the_container(funded_team, machine):
    instance = rented(key_client(funded_team), machine, disk_gb=7)
    labels = docker_inspect(instance.container_id)["Config"]["Labels"]
    assert labels["gpumkt.disk_gb"] == "7"


def test_image_pull_progress_reaches_the_instance(funded_team, machine):
    """An image the host lacks is pulled (from a registry on loopback, so Docker really
    downloads and extracts a layer), and the launch reports the pull as it goes."""
    from scheduler.signals import instance_progress
    from tests.marketplace.registry import Registry

    registry = Registry("gpumkt/busybox:latest")
    reports: list[tuple[int, str]] = []

    def record(sender, *, instance_id, progress, message, **kwargs):
        reports.append((progress, message))

    instance_progress.connect(record)
    try:
        instance = rented(key_client(funded_team), machine, image=registry.image)
        pulled = docker_inspect(instance.container_id)["Config"]["Image"]
    finally:
        instance_progress.disconnect(record)
        registry.close()
    assert pulled == registry.image
    assert reports[0] == (5, "Pulling image")
    assert (90, "Pulling image: 1/1 layers") in reports
    assert reports[-1] == (92, "Starting container")
    assert [p for p, _ in reports] == sorted(p for p, _ in reports)
    assert instance.progress == 100 and instance.status_message == "Container started"
