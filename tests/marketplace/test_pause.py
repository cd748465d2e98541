"""Pause, continue and restart on a real host: Docker freezes the container, commands are
refused with a reason meanwhile, the GPUs stay allocated and charged throughout."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.models import Rental
from marketplace.rentals.metering import rental_owed
from scheduler.models import GpuAllocation, InstanceEvent
from scheduler.services import machine_reconcile
from tests.conftest import key_client
from tests.marketplace.conftest import docker_inspect
from tests.marketplace.test_rental_lifecycle import rented

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_pause_continue_and_restart(funded_team, machine):
    client = key_client(funded_team)
    instance = rented(client, machine, num_gpus=2)
    base = f"/api/v1/instances/{instance.pk}/"
    started = docker_inspect(instance.container_id)["State"]["StartedAt"]

    paused = client.post(f"{base}pause/")
    assert paused.status_code == 200 and paused.json()["state"] == "paused", paused.content
    assert docker_inspect(instance.container_id)["State"]["Paused"] is True
    refused = client.post(f"{base}exec/", {"command": "echo hi"}, format="json")
    assert refused.status_code == 409 and "paused" in refused.json()["error"]["message"]
    assert client.post(f"{base}pause/").status_code == 409  # already paused
    assert client.post(f"{base}restart/").status_code == 409  # continue first
    # Its GPUs stay allocated and their clock runs: an hour later, an hour more is owed.
    assert GpuAllocation.objects.filter(instance=instance, released_at=None).count() == 2
    rental = Rental.objects.get(instance=instance)
    assert rental.gpu_clock_since is not None
    now = timezone.now()
    hour = rental_owed(rental, now + timedelta(hours=1)).gpu - rental_owed(rental, now).gpu
    assert hour == 2 * rental.price_per_gpu_hour
    machine_reconcile(machine_id=machine.pk)  # a paused container is not an exited one
    instance.refresh_from_db()
    assert instance.state == "paused"

    assert client.post(f"{base}continue/").json()["state"] == "running"
    state = docker_inspect(instance.container_id)["State"]
    assert state["Running"] and not state["Paused"]
    assert client.post(f"{base}exec/", {"command": "echo hi"}, format="json").json() == {
        "exit_code": 0,
        "output": "hi\n",
    }
    assert Rental.objects.get(instance=instance).gpu_clock_since is not None

    assert client.post(f"{base}restart/").json()["state"] == "running"
    assert docker_inspect(instance.container_id)["State"]["StartedAt"] > started
    reasons = list(InstanceEvent.objects.filter(instance=instance).values_list("reason", flat=True))
    assert reasons[-3:] == [
        "Paused by the renter",
        "Continued by the renter",
        "Restarted by the renter",
    ]
