"""The hosts' commands of issue 35 §2: ``show machine``, ``show maints``, ``cancel maint``,
``set min-bid``, ``delete machine``, ``reports``, with the requests the CLI 1.9.1 sends
(vastai/api/machines.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hosts.models import Machine
from hosts.services import maintenance_window_add
from marketplace.models import ApiKey
from tests.conftest import key_client
from tests.vast.test_translation import rent

pytestmark = [pytest.mark.django_db]


def provider(provider_team):
    return key_client(provider_team, audience=ApiKey.Audience.PROVIDER)


def test_show_machine_answers_a_list_of_one(provider_team, machine):
    response = provider(provider_team).get(f"/api/v0/machines/{machine.pk}?owner=me")
    assert response.status_code == 200, response.content
    rows = response.json()
    assert [row["id"] for row in rows] == [machine.pk] and rows[0]["num_gpus"] == 4


def test_show_and_cancel_maints(provider_team, machine):
    client = provider(provider_team)
    start = timezone.now() + timedelta(days=2)
    maintenance_window_add(
        machine_id=machine.pk, starts_at=start, ends_at=start + timedelta(hours=3), note="power"
    )
    shown = client.get(f"/api/v0/machines/maintenances?owner=me&machine_ids=[{machine.pk}]")
    assert shown.status_code == 200, shown.content
    [row] = shown.json()
    assert row["machine_id"] == machine.pk and row["duration_hours"] == 3.0
    assert row["maintenance_category"] == "power"
    assert row["start_time"] == start.timestamp()
    cancelled = client.put(
        f"/api/v0/machines/{machine.pk}/cancel_maint/",
        {"client_id": "me", "machine_id": machine.pk},
        format="json",
    )
    assert cancelled.status_code == 200 and cancelled.json()["success"] is True
    assert not machine.maintenance_windows.exists()


def test_set_min_bid_changes_only_the_floor(provider_team, machine):
    before = Machine.objects.get(pk=machine.pk)
    response = provider(provider_team).put(
        f"/api/v0/machines/{machine.pk}/minbid/", {"client_id": "me", "price": 0.2}, format="json"
    )
    assert response.status_code == 200, response.content
    after = Machine.objects.get(pk=machine.pk)
    assert after.min_bid_price_per_gpu_hour == 200_000
    assert after.price_per_gpu_hour == before.price_per_gpu_hour
    missing = provider(provider_team).put(
        f"/api/v0/machines/{machine.pk}/minbid/", {"client_id": "me", "price": None}, format="json"
    )
    assert missing.status_code == 400 and "--price" in missing.json()["msg"]


def test_delete_machine_removes_one_never_rented_and_keeps_one_with_rentals(
    provider_team, machine, funded_team, sim_host_factory
):
    from tests.marketplace.conftest import machine_for

    spare = machine_for(sim_host_factory(gpus=1), provider_team)
    client = provider(provider_team)
    rent(key_client(funded_team), machine)
    kept = client.post(f"/api/v0/machines/{machine.pk}/force_delete/")
    assert kept.status_code == 400 and "unlist it instead" in kept.json()["msg"]
    assert Machine.objects.filter(pk=machine.pk).exists()
    removed = client.post(f"/api/v0/machines/{spare.pk}/force_delete/")
    assert removed.status_code == 200 and removed.json()["success"] is True
    assert not Machine.objects.filter(pk=spare.pk).exists()


def test_reports_and_another_teams_machine(provider_team, machine, funded_team):
    assert provider(provider_team).get(f"/api/v0/machines/{machine.pk}/reports/").json() == []
    renter = key_client(funded_team)
    for method, path in [
        ("get", f"/api/v0/machines/{machine.pk}"),
        ("get", f"/api/v0/machines/maintenances?machine_ids=[{machine.pk}]"),
        ("put", f"/api/v0/machines/{machine.pk}/cancel_maint/"),
        ("put", f"/api/v0/machines/{machine.pk}/minbid/"),
        ("post", f"/api/v0/machines/{machine.pk}/force_delete/"),
        ("get", f"/api/v0/machines/{machine.pk}/reports/"),
    ]:
        body = None if method == "get" else {"price": 0.1}
        response = getattr(renter, method)(path, body, format="json")
        assert response.status_code == 404, (method, path, response.content)
        assert f"Machine {machine.pk} is not one of your team's machines" in response.json()["msg"]
    assert Machine.objects.get(pk=machine.pk).min_bid_price_per_gpu_hour is None
