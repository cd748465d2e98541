"""Maintenance windows, removal, and the new endpoints with an owner, a teammate, an outsider."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from hosts import services
from hosts.models import Machine, MaintenanceWindow
from hosts.selectors import maintenance_overlapping, next_maintenance
from marketplace.models import ApiKey
from tests.conftest import client_for, key_client
from tests.hosts.support import online_machine

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def hours(n: float):
    return timezone.now() + timedelta(hours=n)


def test_maintenance_windows_never_overlap_and_the_scheduler_can_ask(team, sim_host):
    machine = online_machine(team, sim_host)
    window = services.maintenance_window_add(
        machine_id=machine.pk, starts_at=hours(10), ends_at=hours(12), note="driver upgrade"
    )
    assert maintenance_overlapping(machine.pk, hours(11), hours(30)) == window
    assert maintenance_overlapping(machine.pk, hours(12.5), hours(30)) is None
    assert next_maintenance(machine.pk) == window
    with pytest.raises(ValidationError) as caught:
        services.maintenance_window_add(
            machine_id=machine.pk, starts_at=hours(11), ends_at=hours(13)
        )
    assert "starts_at" in caught.value.message_dict
    assert MaintenanceWindow.objects.count() == 1


@pytest.mark.parametrize(
    ("starts", "ends", "field"),
    [
        (5, 4, "ends_at"),  # ends before it starts
        (-5, -1, "ends_at"),  # already over
        (1, 24 * 15 + 1, "ends_at"),  # longer than 14 days
        (24 * 400, 24 * 401, "starts_at"),  # more than a year ahead
    ],
)
def test_maintenance_window_validation_names_the_field(team, sim_host, starts, ends, field):
    machine = online_machine(team, sim_host)
    with pytest.raises(ValidationError) as caught:
        services.maintenance_window_add(
            machine_id=machine.pk, starts_at=hours(starts), ends_at=hours(ends)
        )
    assert field in caught.value.message_dict
    assert not MaintenanceWindow.objects.exists()


def test_maintenance_in_the_console(client, team, owner, sim_host):
    machine = online_machine(team, sim_host)
    client_for(client, owner, team)
    start, end = hours(30), hours(33)
    page = client.post(
        f"/machines/{machine.pk}/maintenance/",
        {"starts_at": start.strftime("%Y-%m-%dT%H:%M"), "ends_at": end.strftime("%Y-%m-%dT%H:%M"),
         "note": "new PSU"},
        follow=True,
    ).content.decode()  # fmt: skip
    assert "Maintenance window added" in page and "new PSU" in page
    window = MaintenanceWindow.objects.get(machine=machine)
    bad = client.post(
        f"/machines/{machine.pk}/maintenance/",
        {"starts_at": "tomorrow", "ends_at": ""},
        follow=True,
    ).content.decode()
    assert "starts at: Use a date and time" in bad
    client.post(f"/machines/{machine.pk}/maintenance-cancel/", {"window": window.pk})
    assert not MaintenanceWindow.objects.exists()


def test_a_bad_maintenance_field_is_named_and_nothing_is_written(client, team, owner, sim_host):
    machine = online_machine(team, sim_host)
    client_for(client, owner, team)
    page = client.post(
        f"/machines/{machine.pk}/maintenance/",
        {"starts_at": hours(30).strftime("%Y-%m-%dT%H:%M"), "ends_at": "soon", "note": "PSU"},
        follow=True,
    ).content.decode()
    assert "ends at: Use a date and time like 2027-06-30 22:00." in page
    assert "starts at:" not in page and not MaintenanceWindow.objects.exists()
    window = services.maintenance_window_add(
        machine_id=machine.pk, starts_at=hours(30), ends_at=hours(33)
    )
    page = client.post(
        f"/machines/{machine.pk}/maintenance-cancel/", {"window": "first"}, follow=True
    ).content.decode()
    assert "window: No such maintenance window." in page
    assert MaintenanceWindow.objects.filter(pk=window.pk).exists()


def test_a_machine_never_rented_can_be_removed(client, team, owner, sim_host):
    machine = online_machine(team, sim_host)
    client_for(client, owner, team)
    response = client.post(f"/machines/{machine.pk}/remove/", follow=True)
    assert response.redirect_chain[-1][0] == "/machines/"
    assert not Machine.objects.filter(pk=machine.pk).exists()


def test_outsider_gets_404_from_every_new_endpoint_and_nothing_changes(
    client, team, owner, outsider, sim_host
):
    machine = online_machine(team, sim_host)
    window = services.maintenance_window_add(
        machine_id=machine.pk, starts_at=hours(5), ends_at=hours(6)
    )
    client_for(client, outsider)
    for action in (
        "self-test",
        "maintenance",
        "maintenance-cancel",
        "remove",
        "probe",
        "reconnect",
    ):
        assert (
            client.post(f"/machines/{machine.pk}/{action}/", {"window": window.pk}).status_code
            == 404
        )
    api = f"/api/v1/machines/{machine.pk}"
    assert client.get(f"{api}/events/").status_code == 404
    assert client.get(f"{api}/maintenance/").status_code == 404
    assert client.post(f"{api}/self-test/").status_code == 404
    assert client.post(f"{api}/reconnect/").status_code == 404
    assert client.delete(f"{api}/maintenance/{window.pk}/").status_code == 404
    assert client.delete(f"{api}/").status_code == 404
    assert Machine.objects.filter(pk=machine.pk).exists()
    assert MaintenanceWindow.objects.filter(pk=window.pk).exists()
    assert machine.self_test_at is None and Machine.objects.get(pk=machine.pk).self_test_at is None


def test_teammate_reads_but_cannot_change(client, team, owner, teammate, sim_host):
    machine = online_machine(team, sim_host)
    client_for(client, teammate, team)
    page = client.get(f"/machines/{machine.pk}/").content.decode()
    assert machine.name in page and "self-test-button" not in page
    assert client.post(f"/machines/{machine.pk}/remove/").status_code == 403
    assert client.get(f"/api/v1/machines/{machine.pk}/events/").status_code == 200
    assert client.post(f"/api/v1/machines/{machine.pk}/self-test/").status_code == 403
    assert Machine.objects.filter(pk=machine.pk).exists()


def test_maintenance_and_events_through_the_api(team, owner, sim_host):
    machine = online_machine(team, sim_host)
    api = key_client(team, audience=ApiKey.Audience.PROVIDER)
    url = f"/api/v1/machines/{machine.pk}/maintenance/"
    created = api.post(
        url, {"starts_at": hours(2).isoformat(), "ends_at": hours(3).isoformat(), "note": "x"},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.content
    clash = api.post(
        url, {"starts_at": hours(2.5).isoformat(), "ends_at": hours(4).isoformat()}, format="json"
    )
    assert clash.status_code == 400 and "starts_at" in clash.json()["error"]["fields"]
    assert [w["note"] for w in api.get(url).json()] == ["x"]
    kinds = [e["kind"] for e in api.get(f"/api/v1/machines/{machine.pk}/events/").json()["results"]]
    assert kinds[0] == "maintenance" and "registered" in kinds
    assert api.delete(f"{url}{created.json()['id']}/").status_code == 204
    assert api.get(url).json() == []
    read_only = key_client(team, access=ApiKey.Access.READ, audience=ApiKey.Audience.PROVIDER)
    assert read_only.delete(f"/api/v1/machines/{machine.pk}/").status_code == 403
    assert api.delete(f"/api/v1/machines/{machine.pk}/").status_code == 204
    assert not Machine.objects.filter(pk=machine.pk).exists()


def test_operators_see_machines_in_the_admin_and_mark_them_verified(client, team, sim_host):
    from tests.factories import UserFactory

    machine = online_machine(team, sim_host)
    operator = UserFactory(username="operator", is_staff=True, is_superuser=True)
    client.force_login(operator)
    assert machine.name in client.get("/admin/hosts/machine/").content.decode()
    assert client.get(f"/admin/hosts/machine/{machine.pk}/change/").status_code == 200
    assert client.get("/admin/hosts/machineevent/").status_code == 200
    # A reason is asked for first; without one nothing changes.
    asked = client.post(
        "/admin/hosts/machine/",
        {"action": "restore_verified", "_selected_action": [machine.pk], "apply": "1"},
    )
    assert "A reason is required; nothing was changed." in asked.content.decode()
    assert Machine.objects.get(pk=machine.pk).verified is False
    client.post(
        "/admin/hosts/machine/",
        {"action": "restore_verified", "_selected_action": [machine.pk], "reason": "checked"},
    )
    machine.refresh_from_db()
    assert machine.verified is True
    assert machine.verification_detail == "Verification restored by operator operator: checked"
