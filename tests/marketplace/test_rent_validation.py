"""What a renter asks to run is checked by the renting service itself, whoever calls it (API,
console form, a script), and the database refuses what slips past: nothing invalid is ever
allocated, held or stored."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from billing.models import Hold
from marketplace.models import Rental
from marketplace.rentals.renting import RentalRequest, rental_create
from scheduler.models import GpuAllocation, Instance
from tests.conftest import client_for
from tests.marketplace.test_console_actions import RENT_FORM, page_messages

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def nothing_written() -> bool:
    return not (
        Instance.objects.exists()
        or Rental.objects.exists()
        or Hold.objects.exists()
        or GpuAllocation.objects.exists()
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("launch_mode", "privileged"),
        ("launch_mode", "ssh; rm -rf /"),
        ("image", "busybox --privileged"),
        ("entrypoint", "--privileged"),
        ("env", {"NVIDIA_VISIBLE_DEVICES": "all"}),
        ("ports", [0]),
        ("label", "two\nlines"),
        ("label", "x" * 101),
        # An image id (or a prefix of one) runs a local copy past every check a name gets.
        ("image", "sha256:" + "a" * 64),
    ],
)
def test_the_renting_service_refuses_bad_specs_naming_the_field(funded_team, machine, field, value):
    request = RentalRequest(
        machine_id=machine.pk, gpu_count=1, image="gpumkt/busybox:latest", hours=1
    )
    request = RentalRequest(**{**request.__dict__, field: value})
    with pytest.raises(ValidationError) as refused:
        rental_create(team=funded_team, request=request)
    assert field in refused.value.message_dict
    assert nothing_written()


@pytest.mark.parametrize("hours", [float("nan"), float("inf"), float("-inf"), 0.001, 1e300])
def test_the_renting_service_refuses_hours_that_are_no_duration(funded_team, machine, hours):
    """Whoever calls it: NaN passed every range check by failing it, then crashed a timedelta."""
    request = RentalRequest(
        machine_id=machine.pk, gpu_count=1, image="gpumkt/busybox:latest", hours=hours
    )
    with pytest.raises(ValidationError) as refused:
        rental_create(team=funded_team, request=request)
    assert "at least" in refused.value.message_dict["duration_hours"][0]
    assert nothing_written()


def test_the_console_form_refuses_an_unknown_launch_mode(client, owner, funded_team, machine):
    console = client_for(client, owner, funded_team)
    response = console.post(
        f"/offers/{machine.pk}/rent/", {**RENT_FORM, "launch_mode": "root"}, follow=True
    )
    assert page_messages(response) == [
        "Could not rent: launch mode: Choose one of entrypoint, ssh, jupyter."
    ]
    assert nothing_written()


def test_the_database_refuses_an_unknown_launch_mode_or_state(funded_team, machine):
    instance = Instance.objects.create(
        team=funded_team, machine=machine, gpu_count=1, image="gpumkt/busybox:latest"
    )
    for field, value in (("launch_mode", "root"), ("state", "hijacked")):
        with pytest.raises(IntegrityError), transaction.atomic():
            Instance.objects.filter(pk=instance.pk).update(**{field: value})
    instance.refresh_from_db()
    assert (instance.launch_mode, instance.state) == ("entrypoint", "launching")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ports", "8080, http", "ports: 'http' is not a port number."),
        ("ports", "8080 70000", "ports: Ensure this value is less than or equal to 65535."),
        ("env", "FOO=1\nBAR", "env: Line 2 is not KEY=value."),
        (
            "duration_hours",
            "0.001",
            "duration hours: Rent for at least 0.01 and at most 8760 hours.",
        ),
        ("image", "busybox --privileged", None),
    ],
)
def test_the_console_rent_form_refuses_a_bad_field_by_name_and_writes_nothing(
    client, owner, funded_team, machine, field, value, message
):
    console = client_for(client, owner, funded_team)
    response = console.post(f"/offers/{machine.pk}/rent/", {**RENT_FORM, field: value}, follow=True)
    [shown] = page_messages(response)
    label = field.replace("_", " ")
    assert shown.startswith(f"Could not rent: {label}: "), shown
    if message:
        assert shown == f"Could not rent: {message}"
    assert nothing_written()


def test_the_console_and_the_api_refuse_a_launch_mode_in_the_same_words(
    client, owner, funded_team, machine
):
    """One field rule, two doors: the rent form hands its fields to the API's serializer."""
    console = client_for(client, owner, funded_team)
    body = {
        "machine_id": machine.pk, "num_gpus": 1, "duration_hours": 1,
        "image": "gpumkt/busybox:latest", "launch_mode": "root",
    }  # fmt: skip
    answer = console.post("/api/v1/instances/", body, content_type="application/json")
    assert answer.status_code == 400
    assert answer.json()["error"]["fields"] == {
        "launch_mode": ["Choose one of entrypoint, ssh, jupyter."]
    }
    assert nothing_written()


def test_an_instance_is_named_through_the_api_and_a_bad_name_is_refused(funded_team, machine):
    from tests.conftest import key_client

    request = RentalRequest(
        machine_id=machine.pk, gpu_count=1, image="gpumkt/busybox:latest", hours=1, label="first"
    )
    rental = rental_create(team=funded_team, request=request).rental
    api = key_client(funded_team)
    url = f"/api/v1/instances/{rental.instance_id}/"
    assert api.get(url).json()["label"] == "first"
    named = api.post(url + "label/", {"label": "  second  "}, format="json")
    assert named.status_code == 200 and named.json()["label"] == "second"
    bad = api.post(url + "label/", {"label": "a\tb"}, format="json")
    assert bad.status_code == 400 and "label" in bad.json()["error"]["fields"]
    assert api.get(url).json()["label"] == "second"
