"""A machine whose first contact was lost (the worker reading its host key died, or the task
was dropped) is not left "connecting" for ever: heartbeats read its key again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hosts import services
from hosts.models import Machine, MachineStatus
from hosts.tasks import heartbeats

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_heartbeats_read_the_key_of_a_machine_whose_first_contact_was_lost(team, sim_host):
    lost = services.machine_register(
        team_id=team.pk, name="lost", address=sim_host.address, port=sim_host.port,
        ssh_user=sim_host.user,
    )  # fmt: skip
    Machine.objects.filter(pk=lost.pk).update(created_at=timezone.now() - timedelta(minutes=2))
    assert services.machines_never_reached() == [lost.pk]
    heartbeats()  # its task runs here (eager), as a worker would run it
    lost.refresh_from_db()
    assert lost.status == MachineStatus.AWAITING_CONFIRMATION
    assert lost.offered_key_fingerprint == sim_host.host_key_fingerprint
    assert lost.host_key == ""  # read, not trusted: the provider still confirms it
    assert services.machines_never_reached() == []


def test_a_machine_just_registered_is_left_to_its_own_first_contact(team, sim_host):
    services.machine_register(
        team_id=team.pk, name="new", address=sim_host.address, port=sim_host.port,
        ssh_user=sim_host.user,
    )  # fmt: skip
    assert services.machines_never_reached() == []
