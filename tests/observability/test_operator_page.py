"""The operator page: staff only (404 for everyone else); machines by state, the reasons of
launches that failed in the last hour, and the queues."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.models import InstanceEvent
from tests.conftest import client_for, key_client
from tests.factories import UserFactory

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

NO_SSHD = "Launch failed: image has no sshd; use an image with an OpenSSH server installed"


def failed_launch(team, machine) -> int:
    """A real launch that fails on the host: busybox has no sshd for SSH mode."""
    response = key_client(team).post(
        "/api/v1/instances/",
        {
            "machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
            "duration_hours": 1, "launch_mode": "ssh", "ports": [],
        },
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    instance_id = response.json()["id"]
    assert InstanceEvent.objects.filter(instance_id=instance_id, reason=NO_SSHD).exists()
    return instance_id


def test_the_operator_page_is_404_for_anyone_but_staff(client, funded_team, owner):
    assert client.get("/operator/").status_code == 404  # not even a log-in redirect
    client_for(client, owner, funded_team)
    assert client.get("/operator/").status_code == 404


def test_staff_see_machines_by_state_failed_launches_with_reasons_and_queues(
    client, funded_team, machine
):
    instance_id = failed_launch(funded_team, machine)
    client.force_login(UserFactory(username="operator", is_staff=True))
    response = client.get("/operator/")
    assert response.status_code == 200
    page = response.content.decode()
    assert f'data-instance="{instance_id}"' in page
    assert NO_SSHD in page
    assert machine.name in page
    assert 'data-status="online"' in page and 'data-queue="celery"' in page

    # An hour later it is no longer a recent failure.
    InstanceEvent.objects.filter(instance_id=instance_id).update(
        created_at=timezone.now() - timedelta(hours=1, minutes=1)
    )
    page = client.get("/operator/").content.decode()
    assert NO_SSHD not in page and "No launch failed in the last hour." in page
