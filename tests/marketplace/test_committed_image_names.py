"""A team's committed image runs for that team only, under any name Docker gives it: Docker
Hub's own spellings (``docker.io/``, ``index.docker.io/``) reach the same local image as the
bare ``gpumkt-team-<id>/…`` name (found with issue 30 §1, a sibling: another team's image
on a machine)."""

from __future__ import annotations

import subprocess

import pytest

from marketplace.models import CommittedImage, Role
from scheduler.models import Instance
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("spelling", ["docker.io/", "index.docker.io/"])
def test_another_teams_committed_image_is_refused_under_docker_hubs_names(
    funded_team, machine, docker_engine, spelling
):
    reference = f"gpumkt-team-{funded_team.pk}/trainer:v1"
    CommittedImage.objects.create(
        team=funded_team, machine=machine, reference=reference, instance_id=1, version=1
    )
    subprocess.run(["docker", "tag", docker_engine, reference], check=True)
    other = TeamFactory(name="Other renters")
    add_member(other, UserFactory(username="other-owner"), Role.OWNER)
    fund(other)
    try:
        response = key_client(other).post(
            "/api/v1/instances/",
            {"machine_id": machine.pk, "num_gpus": 1, "image": spelling + reference,
             "duration_hours": 1},
            format="json",
        )  # fmt: skip
    finally:
        subprocess.run(["docker", "image", "rm", reference], capture_output=True)

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "image" in error["fields"], error
    assert "not one of your team's images" in str(error["fields"]["image"])
    assert not Instance.objects.filter(team=other).exists()
