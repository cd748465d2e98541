"""The provider's pages and API, with an owner, a teammate and an outsider."""

from __future__ import annotations

import re

import pytest

from hosts.models import Machine, MachineStatus
from marketplace.models import ApiKey, Offer
from tests.conftest import client_for, key_client

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_provider_adds_confirms_prices_and_lists_a_machine_in_the_console(
    client, team, owner, sim_host_factory
):
    host = sim_host_factory(gpus=2)
    client_for(client, owner, team)
    page = client.get("/machines/add/").content.decode()
    # The team's platform key, to put in the machine's authorized_keys (as the provider does).
    host.authorize(re.search(r'<code id="platform-key">([^<]+)</code>', page).group(1))
    response = client.post(
        "/machines/add/",
        {"name": "box", "address": host.address, "port": host.port, "ssh_user": "root"},
    )
    machine = Machine.objects.get(team=team)
    assert response.url == f"/machines/{machine.pk}/"
    page = client.get(response.url).content.decode()
    assert host.host_key_fingerprint in page and "pin this key" in page
    client.post(f"/machines/{machine.pk}/confirm/", {"fingerprint": host.host_key_fingerprint})
    machine.refresh_from_db()
    assert machine.status == MachineStatus.ONLINE and machine.gpu_count == 2
    page = client.get(f"/machines/{machine.pk}/").content.decode()
    assert 'name="port_range_start"' in page and 'value="20000"' in page
    client.post(
        f"/machines/{machine.pk}/terms/",
        {"price": "0.85", "storage_price": "0.10", "min_gpus": "1", "location": "DE",
         "port_range_start": "30000", "port_range_end": "30099"},
    )  # fmt: skip
    client.post(f"/machines/{machine.pk}/list/")
    machine.refresh_from_db()
    assert machine.listed and machine.price_per_gpu_hour == 850_000
    assert (machine.port_range_start, machine.port_range_end) == (30000, 30099)
    page = client.get("/machines/").content.decode()
    assert page.count('class="gpu-cell free"') == 2
    assert Offer.objects.get(machine=machine, all_free=True).rentable


def test_bad_price_names_the_field_and_changes_nothing(client, team, owner, sim_host_factory):
    host = sim_host_factory(gpus=1)
    client_for(client, owner, team)
    client.post("/machines/add/", {"address": host.address, "port": host.port, "ssh_user": "root"})
    machine = Machine.objects.get(team=team)
    response = client.post(
        f"/machines/{machine.pk}/terms/",
        {"price": "-3", "storage_price": "0", "min_gpus": "1"},
        follow=True,
    )
    assert "must not be negative" in response.content.decode()
    machine.refresh_from_db()
    assert machine.price_per_gpu_hour == 0
    for field, value, message in [
        ("min_gpus", "two", "min gpus: A whole number."),
        ("port_range_start", "-5", "port range start: A whole number."),
        ("port_range_end", "99999999999999", "port range end: A whole number."),
        ("port_range_start", "80", "port range start: A range of host ports within 1024-65535"),
    ]:
        form = {"price": "1", "storage_price": "0", "min_gpus": "1", field: value}
        response = client.post(f"/machines/{machine.pk}/terms/", form, follow=True)
        assert message in response.content.decode(), (field, value)
    machine.refresh_from_db()
    assert machine.price_per_gpu_hour == 0 and machine.port_range_start == 20000


def test_teammate_sees_outsider_gets_404_and_lists_do_not_leak(
    client, team, owner, teammate, outsider, sim_host_factory
):
    host = sim_host_factory(gpus=1)
    client_for(client, owner, team)
    client.post(
        "/machines/add/",
        {"name": "secret-box", "address": host.address, "port": host.port, "ssh_user": "root"},
    )
    machine = Machine.objects.get(team=team)
    client.logout()
    client_for(client, teammate, team)
    assert "secret-box" in client.get("/machines/").content.decode()
    assert (
        client.post(f"/machines/{machine.pk}/list/").status_code == 403
    )  # members cannot change listings
    client.logout()
    client_for(client, outsider)
    assert "secret-box" not in client.get("/machines/").content.decode()
    assert client.get(f"/machines/{machine.pk}/").status_code == 404
    assert client.post(f"/machines/{machine.pk}/unlist/").status_code == 404
    assert client.get("/api/v1/machines/").json()["results"] == []
    assert client.get(f"/api/v1/machines/{machine.pk}/").status_code == 404
    assert (
        client.put(
            f"/api/v1/machines/{machine.pk}/listing/",
            {"listed": False},
            content_type="application/json",
        ).status_code
        == 404
    )


def test_provider_api_flow_with_a_key(team, owner, sim_host_factory):
    host = sim_host_factory(gpus=1)
    api = key_client(team, audience=ApiKey.Audience.PROVIDER)
    host.authorize(api.get("/api/v1/machines/platform-key/").json()["public_key"])
    created = api.post(
        "/api/v1/machines/", {"address": host.address, "port": host.port}, format="json"
    )
    assert created.status_code == 201, created.content
    machine_id = created.json()["id"]
    body = api.get(f"/api/v1/machines/{machine_id}/").json()
    assert body["offered_key_fingerprint"] == host.host_key_fingerprint
    wrong = api.post(
        f"/api/v1/machines/{machine_id}/confirm/", {"fingerprint": "SHA256:nope"}, format="json"
    )
    assert wrong.status_code == 400 and "fingerprint" in wrong.json()["error"]["fields"]
    api.post(
        f"/api/v1/machines/{machine_id}/confirm/",
        {"fingerprint": host.host_key_fingerprint},
        format="json",
    )
    terms = api.put(
        f"/api/v1/machines/{machine_id}/terms/",
        {
            "price_per_gpu_hour": "0.60",  # dollars, as every money field of the API
            "storage_price_per_gb_month": "0.05",
            "min_gpus": 1,
            "location": "US",
        },
        format="json",
    )
    assert terms.status_code == 200, terms.content
    listed = api.put(f"/api/v1/machines/{machine_id}/listing/", {"listed": True}, format="json")
    assert listed.json()["listed"] is True
    renter_key = key_client(team, audience=ApiKey.Audience.RENTER)
    assert renter_key.get("/api/v1/machines/").status_code == 403
