"""Lists of instances (the API's, the vast.ai-compatible one, a deployment's replicas) read
what each instance holds (its GPUs, its host ports) for the whole page at once: a page of
many instances costs the statements of a page of one, and shows each instance exactly as it
shows alone."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marketplace.rentals.renting import rental_create
from marketplace.rentals.terms import RentalRequest
from tests.conftest import key_client
from tests.factories import TeamFactory
from tests.marketplace.conftest import fund
from tests.marketplace.test_deployment_placing import paper_machine

pytestmark = pytest.mark.django_db


def rent(team, machine, gpus: int, ports: list[int]) -> None:
    rental_create(
        team=team,
        request=RentalRequest(
            machine_id=machine.pk, gpu_count=gpus, image="gpumkt/busybox:latest", hours=1.0,
            ports=ports,
        ),
    )  # fmt: skip


def statements(api, path: str) -> tuple[int, dict]:
    """The statements a GET of ``path`` runs, and its answer. (A first request also notes
    that the key was used: asked once before, so both counts leave that out.)"""
    api.get(path)
    with CaptureQueriesContext(connection) as queries:
        answer = api.get(path)
    assert answer.status_code == 200, answer.content
    return len(queries), answer.json()


def one_then_more(team, path: str, more: list[tuple[int, list[int]]]) -> tuple[int, int, dict]:
    """The statements ``path`` runs with one instance of the team, then after renting
    ``more`` ((GPUs, container ports) each, on a machine of its own), and the last answer."""
    provider = TeamFactory(name="Provider")
    fund(team, 500)
    api = key_client(team)
    rent(team, paper_machine(provider, gpus=3), 2, [8080])
    one, _ = statements(api, path)
    for gpus, ports in more:
        rent(team, paper_machine(provider, gpus=3), gpus, ports)
    many, listed = statements(api, path)
    return one, many, listed


def test_the_instance_list_costs_the_same_statements_for_one_instance_or_five(team, owner):
    more = [(1, [22]), (2, [8080, 9000]), (1, []), (3, [7000])]

    one, five, listed = one_then_more(team, "/api/v1/instances/", more)

    assert five == one
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert len(rows) == 5
    api = key_client(team)
    for row in rows:  # each as it shows alone, read without the list's prefetch
        alone = api.get(f"/api/v1/instances/{row['id']}/").json()
        assert row["gpus"] == alone["gpus"] and len(row["gpus"]) == row["gpu_count"]
        assert row["connection"] == alone["connection"]
    assert sorted(p["container_port"] for r in rows for p in r["connection"]["ports"]) == [
        22, 7000, 8080, 8080, 9000
    ]  # fmt: skip


def test_the_vast_instance_list_costs_the_same_statements_for_one_instance_or_four(team, owner):
    one, four, listed = one_then_more(
        team, "/api/v0/instances/?owner=me", [(1, [22]), (1, [8080, 9000]), (1, [])]
    )

    assert four == one
    assert len(listed["instances"]) == 4
