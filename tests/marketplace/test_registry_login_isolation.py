"""One team's registry login never changes what another team may run (issue 30, §1).

Against real registries on loopback (tests/marketplace/registry.py), one behind a login and
one open, with real ``docker login`` and ``docker pull`` on a simulated host: a made-up login
fails only the rental that gave it, saying which fields to fix; a public image pulled with a
login stays usable by everyone; an image the registry proves private runs only for a team
that proves access with its own login."""

from __future__ import annotations

import importlib
import subprocess
import uuid

import pytest
from django.apps import apps
from django.db import connection

from hosts.runtime import image_repository
from marketplace.models import Role
from scheduler.models import GpuAllocation, Instance, PrivateRepository
from scheduler.services.private_images import repository_private
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import containers_named, fund
from tests.marketplace.registry import Registry

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

USER = "robot"
MADE_UP = ("anyone", "whatever")  # the login of the report
QUICK_STOP = ["-c", "trap 'exit 0' TERM; echo up; while :; do sleep 1; done"]


def a_password() -> str:
    return f"tok-{uuid.uuid4().hex}"


def other_team(name: str):
    team = TeamFactory(name=name)
    add_member(team, UserFactory(username=f"{name.lower().replace(' ', '-')}-owner"), Role.OWNER)
    fund(team)
    return team


def rent(team, machine, image: str, login: tuple[str, str] | None = None) -> Instance:
    """Rent one GPU of ``machine`` running ``image`` (the launch runs eagerly)."""
    body = {
        "machine_id": machine.pk, "num_gpus": 1, "image": image, "duration_hours": 1,
        "entrypoint": "sh", "args": QUICK_STOP,
    }  # fmt: skip
    if login is not None:
        body |= {"registry_username": login[0], "registry_password": login[1]}
    response = key_client(team).post("/api/v1/instances/", body, format="json")
    assert response.status_code == 201, response.content
    return Instance.objects.get(pk=response.json()["id"])


def shown(team, instance: Instance) -> dict:
    return key_client(team).get(f"/api/v1/instances/{instance.pk}/").json()


@pytest.fixture
def cached_only(docker_engine):
    """An image on the machine's engine under a registry's name that no registry serves (as a
    provider's pre-loaded image, or the report's ``gpumkt/busybox:latest``)."""
    made = []

    def tag(registry: Registry) -> str:
        image = f"{registry.address}/gpumkt/cached:{uuid.uuid4().hex[:12]}"
        subprocess.run(["docker", "tag", docker_engine, image], check=True)
        made.append(image)
        return image

    yield tag
    for image in made:
        subprocess.run(["docker", "image", "rm", image], capture_output=True)


def test_a_made_up_login_fails_only_its_own_rental_and_blocks_no_one(
    funded_team, machine, docker_engine, cached_only
):
    registry = Registry(docker_engine, username=USER, password=a_password())
    other = other_team("Other renters")
    try:
        image = cached_only(registry)
        bogus = rent(funded_team, machine, image, login=MADE_UP)
        # Then another team, and the same team without the login, run the image at once.
        theirs = rent(other, machine, image)
        own_again = rent(funded_team, machine, image)
    finally:
        registry.close()

    # The renter who gave the made-up login is told which fields the registry refused.
    assert bogus.state == "failed"
    message = shown(funded_team, bogus)["status_message"]
    assert "registry_username" in message and "registry_password" in message, message
    assert "could not log in to the registry" in message and MADE_UP[1] not in message
    assert containers_named(bogus.container_name) == []
    assert not GpuAllocation.objects.filter(instance=bogus, released_at=None).exists()
    # The registry was asked about that login only, and gave nothing out.
    assert "invalid" in {r.login for r in registry.requests}, registry.requests
    assert {(r.path, r.status) for r in registry.requests} == {("/v2/", 401)}
    # Nobody else is affected: the local copy runs for the other team as before.
    assert theirs.state == "running", theirs.status_message
    assert own_again.state == "running", own_again.status_message


def test_a_public_image_pulled_with_any_login_stays_usable_by_everyone(
    funded_team, machine, docker_engine
):
    """An open registry accepts any login: the pull works, and the image is not taken for
    private. Other teams then run the local copy, even while the registry is down."""
    registry = Registry(docker_engine)
    other = other_team("Other renters")
    try:
        first = rent(funded_team, machine, registry.image, login=MADE_UP)
        assert first.state == "running", first.status_message
        registry.stop_serving()  # an outage: only the machine's copy is left
        theirs = rent(other, machine, registry.image)
    finally:
        registry.close()

    assert theirs.state == "running", theirs.status_message
    assert shown(other, theirs)["status_message"] == "Container started"


def test_a_private_image_runs_only_for_teams_proving_their_own_login(
    funded_team, machine, docker_engine
):
    password = a_password()
    registry = Registry(docker_engine, username=USER, password=password)
    other = other_team("Other renters")
    try:
        owner = rent(funded_team, machine, registry.image, login=(USER, password))
        assert owner.state == "running", owner.status_message
        # The registry said it is private: a pull without a login was refused.
        assert any(r.login == "" and r.status == 401 for r in registry.requests)

        without = rent(other, machine, registry.image)
        made_up = rent(other, machine, registry.image, login=MADE_UP)
        with_own = rent(other, machine, registry.image, login=(USER, password))
    finally:
        registry.close()

    # No login: the local copy is not theirs to run.
    assert without.state == "failed"
    assert f"could not pull {registry.image} without a login" in without.status_message
    assert "registry_username and registry_password" in without.status_message
    assert containers_named(without.container_name) == []
    # A made-up login: refused, saying which fields.
    assert made_up.state == "failed"
    message = shown(other, made_up)["status_message"]
    assert "registry_username" in message and "registry_password" in message, message
    assert containers_named(made_up.container_name) == []
    # Their own valid login: it runs; the owner's rental ran on throughout.
    assert with_own.state == "running", with_own.status_message
    owner.refresh_from_db()
    assert owner.state == "running"


def test_a_private_image_counts_as_private_while_its_first_pull_runs(
    funded_team, machine, docker_engine
):
    """The layers arrive before the registry's proof: a launch of another team checking
    meanwhile must already find that it has to prove access, not run the fresh local copy."""
    password = a_password()
    seen: list[bool] = []

    def during_pull(path: str) -> None:
        if "/blobs/" in path:
            seen.append(
                repository_private(
                    machine_id=machine.pk, repository=image_repository(registry.image)
                )
            )
            connection.close()  # this thread's own connection

    registry = Registry(docker_engine, username=USER, password=password, on_request=during_pull)
    try:
        owner = rent(funded_team, machine, registry.image, login=(USER, password))
    finally:
        registry.close()
    assert owner.state == "running", owner.status_message
    assert seen and all(seen), seen


def test_marks_left_by_earlier_launches_stay_only_where_a_login_pull_ran(
    funded_team, machine, docker_engine, cached_only
):
    """Before the proof, a launch with a login marked the repository whatever happened next.
    The migration keeps the marks of pulls that ran (proven) and drops the others."""
    password = a_password()
    registry = Registry(docker_engine, username=USER, password=password)
    try:
        cached = cached_only(registry)
        failed = rent(funded_team, machine, cached, login=MADE_UP)
        ran = rent(funded_team, machine, registry.image, login=(USER, password))
    finally:
        registry.close()
    assert (failed.state, ran.state) == ("failed", "running")
    PrivateRepository.objects.all().delete()
    for image in (cached, registry.image):  # as the earlier launches left them
        PrivateRepository.objects.create(
            machine=machine, repository=image_repository(image), proven_at=None
        )

    migration = importlib.import_module("scheduler.migrations.0012_private_repository_proven")
    migration.keep_marks_a_login_pull_earned(apps, None)

    left = list(PrivateRepository.objects.values_list("repository", "proven_at"))
    assert [repository for repository, _ in left] == [image_repository(registry.image)]
    assert left[0][1] is not None
