"""Every number the API reads refuses what is not a usable number, generated from the OpenAPI
schema so a new endpoint is covered the day it is added.

For each operation the schema lists, each number-typed body property (numbers, integers, lists
of them, dollar decimal strings) and each number-typed query parameter gets NaN, ±Infinity,
an overflowing exponent and absurd magnitudes. The answer is a 400 naming the field, never a
500, and nothing in the database changes.
"""

from __future__ import annotations

import json
import re

import pytest
from django.apps import apps
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from billing.credits import credit_grant
from billing.money import MICRO_PER_DOLLAR
from hosts.models import Gpu, Machine
from marketplace.models import Role
from marketplace.rentals.renting import RentalRequest, rental_create
from marketplace.services.offers import offer_refresh
from marketplace.services.templates import template_create
from tests.conftest import client_for, key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.test_console_actions import page_messages

pytestmark = pytest.mark.django_db

# JSON literals, sent as raw text: 1e309 is a legal JSON number that parses to infinity.
BAD_BODY_LITERALS = [
    '"NaN"', '"Infinity"', '"-Infinity"', '"1e309"', "1e309", "-1e309", "-1e300", "1e300",
    "1" + "0" * 30, "true",
]  # fmt: skip
BAD_QUERY_VALUES = ["NaN", "Infinity", "-Infinity", "1e309", "-1e300", "1e300", "1" + "0" * 30]
# Query parameters that clamp instead of refusing a huge whole number: ``tail`` reads "as many
# log lines as there are, up to 5000", so a huge one is a fair request.
CLAMPED = {("tail", "1" + "0" * 30)}

APPS_THAT_HOLD_STATE = ("marketplace", "scheduler", "hosts", "billing")


def machine_for_sale(team, name: str, gpus: int = 2) -> Machine:
    machine = Machine.objects.create(
        team=team, name=name, address=f"10.9.{Machine.objects.count()}.1", status="online",
        listed=True, price_per_gpu_hour=1_450_000, storage_price_per_gb_month=100_000,
        cpu_cores=8 * gpus, ram_mb=32768 * gpus, disk_free_gb=500 * gpus, reliability=0.99,
        driver_version="550.54.14", cuda_version="12.4", location="US",
    )  # fmt: skip
    Gpu.objects.bulk_create(
        Gpu(machine=machine, index=i, uuid=f"GPU-{name}-{i}", name="RTX 4090", memory_mib=24564)
        for i in range(gpus)
    )
    offer_refresh(machine_id=machine.pk)
    return machine


@pytest.fixture
def world(team, owner):
    """A team that rents and provides: its own machine, a rental on another provider's."""
    provider = TeamFactory(name="Provider")
    add_member(provider, UserFactory(username="provider"), Role.OWNER)
    for_rent = machine_for_sale(provider, "for-rent")
    own = machine_for_sale(team, "own")
    credit_grant(
        team_id=team.pk, amount=100 * MICRO_PER_DOLLAR, reason="test", idempotency_key="fund"
    )
    rental = rental_create(
        team=team,
        request=RentalRequest(
            machine_id=for_rent.pk, gpu_count=1, image="gpumkt/busybox:latest", hours=2
        ),
    ).rental
    return {
        "for_rent": for_rent,
        "own": own,
        "instance_id": rental.instance_id,
        "cluster": waiting_cluster(team),
        "volume": volume_row(team, for_rent),
        "template": template_create(
            team=team, user=owner, fields={"name": "numbers", "image": "gpumkt/busybox:latest"}
        ),
    }


def waiting_cluster(team):
    """A cluster whose replicas wait (a GPU no machine has): nothing is placed or launched."""
    from marketplace.clusters.services import ClusterSpec, cluster_create

    spec = ClusterSpec(name="numbers", image="busybox:latest", gpu_names=["No Such GPU"])
    return cluster_create(team=team, spec=spec)


def volume_row(team, machine):
    """A volume as the tables know it (its machine is not reachable: nothing connects)."""
    from datetime import timedelta

    from billing.holds import hold_create
    from marketplace.models import Volume, VolumeVersion

    volume = Volume.objects.create(
        team=team, provider_team=machine.team, machine=machine, name="numbers", size_gb=5,
        storage_price_per_gb_month=100_000, ends_at=timezone.now() + timedelta(days=1),
        clock_since=timezone.now(),
    )  # fmt: skip
    volume.hold_id = hold_create(
        team_id=team.pk, provider_team_id=machine.team_id, amount=1000,
        reference=f"volume:{volume.pk}", idempotency_key=f"numbers-volume-{volume.pk}",
    ).pk  # fmt: skip
    volume.save()
    VolumeVersion.objects.create(volume=volume, number=1, size_gb=5, change="created")
    return volume


@pytest.fixture
def console_api(client, owner, team):
    """A session (the owner's): it may call every endpoint, console-only ones included."""
    client_for(client, owner, team)
    api = APIClient()
    api.cookies = client.cookies
    return api


def fill_path(path: str, world) -> str:
    owners = {
        "/api/v1/machines/": "own",
        "/api/v1/clusters/": "cluster",
        "/api/v1/volumes/": "volume",
        "/api/v1/templates/": "template",
    }
    owner = next((key for prefix, key in owners.items() if path.startswith(prefix)), None)
    ids = {
        "id": world[owner].pk if owner else world["instance_id"],
        "machine_id": world["for_rent"].pk,
        "window_id": 1,
        "month": f"{timezone.now():%Y-%m}",
    }
    return re.sub(r"{(\w+)}", lambda m: str(ids[m.group(1)]), path)


def api_schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def is_number(node: dict) -> bool:
    return node.get("type") in ("number", "integer") or node.get("format") == "decimal"


def number_properties(schema: dict, body: dict) -> list[tuple[str, bool]]:
    """(name, is a list) of each number-typed property of a request body."""
    found = []
    for name, prop in resolve(schema, body).get("properties", {}).items():
        prop = resolve(schema, prop)
        if prop.get("readOnly"):
            continue
        if is_number(prop):
            found.append((name, False))
        elif prop.get("type") == "array" and is_number(resolve(schema, prop.get("items", {}))):
            found.append((name, True))
    return found


def body_cases() -> list:
    schema = api_schema()
    cases = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if not body:
                continue
            for name, is_list in number_properties(schema, body["schema"]):
                cases.append(
                    pytest.param(method, path, name, is_list, id=f"{method} {path} {name}")
                )
    return cases


def query_cases() -> list:
    schema = api_schema()
    cases = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "query" and is_number(parameter.get("schema", {})):
                    name = parameter["name"]
                    cases.append(pytest.param(method, path, name, id=f"{method} {path} ?{name}"))
    return cases


def database_state() -> dict:
    """Every row of the rooms that hold state (last-seen stamps aside)."""
    state = {}
    for label in APPS_THAT_HOLD_STATE:
        for model in apps.get_app_config(label).get_models():
            rows = model.objects.order_by("pk").values()
            state[model._meta.label] = [
                {k: v for k, v in row.items() if k not in ("last_used_at", "last_seen_at")}
                for row in rows
            ]
    return state


def test_the_schema_lists_the_number_inputs_this_test_relies_on():
    """A guard on the generator: if these vanished, the cases below would test nothing."""
    bodies = {(c.values[1], c.values[2]) for c in body_cases()}
    assert ("/api/v1/instances/", "duration_hours") in bodies
    assert ("/api/v1/instances/{id}/extend/", "hours") in bodies
    assert ("/api/v1/machines/{id}/terms/", "price_per_gpu_hour") in bodies
    queries = {(c.values[1], c.values[2]) for c in query_cases()}
    assert ("/api/v1/offers/{machine_id}/quote/", "duration_hours") in queries
    assert ("/api/v1/offers/", "offset") in queries


@pytest.mark.parametrize(("method", "path", "name", "is_list"), body_cases())
def test_bad_numbers_in_a_body_answer_400_naming_the_field(
    world, console_api, method, path, name, is_list
):
    url = fill_path(path, world)
    for literal in BAD_BODY_LITERALS:
        before = database_state()
        value = f"[{literal}]" if is_list else literal
        response = getattr(console_api, method)(
            url, f'{{"{name}": {value}}}', content_type="application/json"
        )
        assert response.status_code == 400, (literal, response.status_code, response.content)
        fields = response.json()["error"]["fields"]
        assert name in fields, (literal, fields)
        assert database_state() == before, literal


@pytest.mark.parametrize(("method", "path", "name"), query_cases())
def test_bad_numbers_in_a_query_answer_400_naming_the_parameter(
    world, console_api, method, path, name
):
    url = fill_path(path, world)
    for text in BAD_QUERY_VALUES:
        before = database_state()
        body = json.dumps({}) if method == "post" else None
        response = getattr(console_api, method)(
            url + f"?{name}={text}", body, content_type="application/json"
        )
        if (name, text) in CLAMPED:
            assert response.status_code == 200, response.content
            continue
        assert response.status_code == 400, (text, response.status_code, response.content)
        assert name in response.json()["error"]["fields"], (text, response.json())
        assert database_state() == before, text


def test_a_rental_for_nan_hours_answers_400_and_holds_nothing(world, team):
    """The defect as the user met it: 500 "cannot convert float NaN to integer"."""
    api = key_client(team)
    body = {"machine_id": world["for_rent"].pk, "num_gpus": 1, "image": "gpumkt/busybox:latest"}
    for hours in ("NaN", "Infinity", "-Infinity", "1e309"):
        before = database_state()
        response = api.post("/api/v1/instances/", {**body, "duration_hours": hours}, format="json")
        assert response.status_code == 400, response.content
        assert "finite" in " ".join(response.json()["error"]["fields"]["duration_hours"])
        assert database_state() == before


# --- the console's forms read numbers with the same rule -----------------------------------


def test_the_console_rent_form_refuses_hours_that_are_not_a_finite_number(
    world, client, owner, team
):
    console = client_for(client, owner, team)
    form = {"num_gpus": "1", "duration_hours": "2", "disk_gb": "10", "image": "gpumkt/busybox"}
    url = f"/offers/{world['for_rent'].pk}/rent/"
    for hours in ("NaN", "nan", "Infinity", "-inf", "1e309"):
        before = database_state()
        response = console.post(url, {**form, "duration_hours": hours}, follow=True)
        assert response.status_code == 200
        assert page_messages(response) == [
            f"Could not rent: duration hours: Enter a finite number ({hours!r} is not one)."
        ]
        assert database_state() == before, hours
    for field, value in (("num_gpus", "1e309"), ("disk_gb", "NaN"), ("num_gpus", "9" * 40)):
        response = console.post(url, {**form, field: value}, follow=True)
        label = field.replace("_", " ")
        assert page_messages(response) == [f"Could not rent: {label}: A whole number."]


def test_the_console_extend_form_refuses_infinite_hours_naming_the_range(
    world, client, owner, team
):
    console = client_for(client, owner, team)
    url = f"/instances/{world['instance_id']}/extend/"
    for hours in ("inf", "-Infinity", "1e309", "NaN"):
        before = database_state()
        response = console.post(url, {"hours": hours}, follow=True)
        assert page_messages(response) == [
            "hours: Extend by at least 0.01 and at most 8760 hours."
        ], hours
        assert database_state() == before, hours
