"""A rent's answer (POST /api/v1/instances/) is built from what the rent wrote, a typed
``Rented`` (its rental, GPUs and ports), not read back: it must be the same instance the API
shows when asked for it afterwards, field for field and in the same order."""

from __future__ import annotations

import pytest

from marketplace.rentals.renting import Rented, rental_create
from marketplace.rentals.terms import RentalRequest
from tests.conftest import key_client
from tests.factories import TeamFactory
from tests.marketplace.conftest import fund
from tests.marketplace.test_deployment_placing import paper_machine

pytestmark = pytest.mark.django_db


def test_the_rent_answer_is_the_instance_as_read_back(team, owner):
    machine = paper_machine(TeamFactory(name="Provider"), gpus=2)
    fund(team)
    api = key_client(team)

    answer = api.post(
        "/api/v1/instances/",
        {"machine_id": machine.pk, "num_gpus": 2, "image": "gpumkt/busybox:latest",
         "duration_hours": 1, "ports": [8080]},
        format="json",
    )  # fmt: skip

    assert answer.status_code == 201, answer.content
    rented = answer.json()
    shown = api.get(f"/api/v1/instances/{rented['id']}/").json()
    assert list(rented) == list(shown)
    assert rented == shown
    assert sorted(rented["gpus"]) == sorted(g.uuid for g in machine.gpus.all())
    assert rented["connection"]["ports"], rented["connection"]


def test_renting_returns_what_it_wrote(team, owner):
    machine = paper_machine(TeamFactory(name="Provider"), gpus=2)
    fund(team)

    rented = rental_create(
        team=team,
        request=RentalRequest(
            machine_id=machine.pk, gpu_count=1, image="gpumkt/busybox:latest", hours=1.0
        ),
    )

    assert isinstance(rented, Rented)
    assert rented.rental.instance_id == rented.instance.pk
    allocated = rented.instance.gpu_allocations.get()
    assert rented.gpu_uuids == [allocated.gpu.uuid]
    written = rented.instance.port_allocations.values_list(
        "container_port", "host_port", "protocol"
    )
    assert sorted(rented.ports) == sorted(written)
    assert not hasattr(rented.instance, "rented_gpu_uuids")  # nothing set on the model
