"""A machine's region is a country (ISO 3166-1): chosen from a list in the console, refused
with the field named when it names none (in the console with everything typed kept), mapped
from the free text machines had, searched as vast.ai's ``geolocation`` and shown as vast.ai
writes it."""

from __future__ import annotations

import importlib
import re

import pytest
from django.apps import apps

from hosts.countries import COUNTRY_TABLE, country_code
from hosts.models import Gpu, Machine, MachineEvent
from marketplace.models import Offer
from marketplace.services.offers import offer_refresh
from marketplace.vast.shapes import vast_geolocation
from tests.conftest import client_for, key_client

pytestmark = pytest.mark.django_db


def listed_machine(team, name: str = "box", *, location: str = "") -> Machine:
    machine = Machine.objects.create(
        team=team, name=name, address=f"10.9.{Machine.objects.count()}.1", status="online",
        listed=True, price_per_gpu_hour=500_000, storage_price_per_gb_month=100_000,
        location=location, cpu_cores=8, ram_mb=32768, disk_free_gb=500, reliability=0.99,
        driver_version="550.54.14", cuda_version="12.4",
    )  # fmt: skip
    Gpu.objects.create(
        machine=machine, index=0, uuid=f"GPU-{machine.pk:08d}-0000-0000-0000-000000000000",
        name="NVIDIA GeForce RTX 4090", memory_mib=24564,
    )  # fmt: skip
    offer_refresh(machine_id=machine.pk)
    return machine


def test_the_country_table_is_iso_3166_1():
    codes = [code for code, *_ in COUNTRY_TABLE]
    assert len(codes) == len(set(codes)) == 249
    assert all(re.fullmatch(r"[A-Z]{2}", code) for code in codes)
    assert country_code("us") == "US" and country_code("DEU") == "DE"
    assert country_code("germany") == "DE" and country_code("Korea, Republic of") == "KR"
    assert country_code("Quebec, CA") == "CA" and country_code("UK") == "GB"
    assert country_code("Mars Base Alpha") is None and country_code("EU") is None


def test_the_api_takes_a_country_and_refuses_free_text_naming_the_field(
    team, owner, django_capture_on_commit_callbacks
):
    machine = listed_machine(team)
    api = key_client(team)
    terms = {"price_per_gpu_hour": 0.5, "storage_price_per_gb_month": 0.1, "min_gpus": 1}
    refused = api.put(
        f"/api/v1/machines/{machine.pk}/terms/", {**terms, "location": "Mars Base Alpha"}, "json"
    )
    assert refused.status_code == 400
    assert "not a country" in refused.json()["error"]["fields"]["location"][0]
    machine.refresh_from_db()
    assert machine.location == "" and not MachineEvent.objects.filter(kind="terms").exists()

    with django_capture_on_commit_callbacks(execute=True):  # offers follow on commit
        taken = api.put(
            f"/api/v1/machines/{machine.pk}/terms/", {**terms, "location": "germany"}, "json"
        )
    assert taken.status_code == 200, taken.content
    machine.refresh_from_db()
    assert machine.location == "DE"
    assert Offer.objects.get(machine=machine, all_free=True).geolocation == "DE"


def test_a_bad_term_keeps_everything_typed_and_names_the_field(client, team, owner):
    machine = listed_machine(team, location="US")
    client_for(client, owner, team)
    typed = {
        "price": "0.75", "storage_price": "0.2", "min_gpus": "1", "min_bid": "0.3",
        "location": "Atlantis", "end_date": "2031-05-04", "port_range_start": "30000",
        "port_range_end": "30099",
    }  # fmt: skip
    response = client.post(f"/machines/{machine.pk}/terms/", typed)
    assert response.status_code == 400
    page = response.content.decode()
    for name in ("price", "storage_price", "min_bid", "end_date", "port_range_start"):
        assert re.search(rf'name="{name}"[^>]*value="{re.escape(typed[name])}"', page), name
    assert re.search(r'id="location-error">[^<]*not a country', page)
    assert 'name="location" id="terms-location" aria-invalid="true"' in page
    machine.refresh_from_db()
    assert (machine.price_per_gpu_hour, machine.location, machine.end_date) == (500_000, "US", None)

    # A refused price keeps the country chosen, selected in the list.
    response = client.post(
        f"/machines/{machine.pk}/terms/", {**typed, "price": "-1", "location": "JP"}
    )
    page = response.content.decode()
    assert response.status_code == 400 and 'id="price-error"' in page
    assert '<option value="JP" selected>Japan (JP)</option>' in page

    saved = client.post(f"/machines/{machine.pk}/terms/", {**typed, "location": "JP"})
    assert saved.status_code == 302
    machine.refresh_from_db()
    assert machine.location == "JP" and machine.price_per_gpu_hour == 750_000
    assert "Japan (JP)</option>" in client.get(f"/machines/{machine.pk}/").content.decode()


def test_free_text_regions_become_countries_or_are_cleared_saying_so(team):
    regions = {
        "code": "us", "alpha3": "DEU", "name": "Japan", "vast": "Quebec, CA", "alias": "UK",
        "mars": "Mars Base Alpha", "continent": "EU", "none": "",
    }  # fmt: skip
    machines = {key: listed_machine(team, key, location=text) for key, text in regions.items()}
    hosts_step = importlib.import_module("hosts.migrations.0014_region_is_a_country")
    offers_step = importlib.import_module("marketplace.migrations.0024_offer_region_is_a_country")
    hosts_step.regions_to_countries(apps, None)
    offers_step.offers_follow_machines(apps, None)

    found = {key: Machine.objects.get(pk=m.pk).location for key, m in machines.items()}
    assert found == {
        "code": "US", "alpha3": "DE", "name": "JP", "vast": "CA", "alias": "GB",
        "mars": "", "continent": "", "none": "",
    }  # fmt: skip
    offers = dict(Offer.objects.filter(all_free=True).values_list("machine__name", "geolocation"))
    assert offers == found
    cleared = MachineEvent.objects.get(machine=machines["mars"]).message
    assert "'Mars Base Alpha' names no country and was cleared" in cleared
    assert not MachineEvent.objects.filter(machine=machines["none"]).exists()


def test_geolocation_searches_and_shows_as_on_vast(team, owner):
    listed_machine(team, "berlin", location="DE")
    listed_machine(team, "austin", location="US")
    listed_machine(team, "nowhere")
    api = key_client(team)

    def found(q: str) -> list[str]:
        response = api.get("/api/v1/offers/", {"q": q})
        assert response.status_code == 200, response.content
        by_id = dict(Machine.objects.values_list("pk", "name"))
        return sorted({by_id[o["machine_id"]] for o in response.json()["offers"]})

    assert found("geolocation in [US,DE]") == ["austin", "berlin"]
    assert found("geolocation=de") == ["berlin"]
    assert found("geolocation=Germany") == ["berlin"]
    assert found("geolocation=United_States") == ["austin"]
    assert found("geolocation notin [US]") == ["berlin", "nowhere"]
    assert vast_geolocation("DE") == "Germany, DE" and vast_geolocation("") == ""
    body = {"geolocation": {"in": ["DE"]}, "rentable": {"eq": True}, "type": "on-demand"}
    v0 = api.post("/api/v0/bundles/", body, format="json")
    assert v0.status_code == 200, v0.content
    assert {o["geolocation"] for o in v0.json()["offers"]} == {"Germany, DE"}
