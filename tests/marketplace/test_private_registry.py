"""Renting an image from a private registry that requires a login, end to end: the renter's
login goes through the API, is kept sealed, reaches the host's ``docker login`` and ``docker
pull`` (real ones, against a registry on loopback that answers 401 without it), and the
container runs that image; the password shows nowhere, and a wrong one fails the launch."""

from __future__ import annotations

import logging
import pwd
import subprocess
import uuid
from pathlib import Path

import pytest

from marketplace.models import Role
from scheduler.models import GpuAllocation, Instance
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import containers_named, docker_inspect, fund
from tests.marketplace.registry import Registry

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

USER = "robot"
MARKER = "/etc/gpumkt-pull-test"  # the file the test registry adds to its image
# Exits at once on `docker stop` (a bare `sleep` as PID 1 ignores SIGTERM for 10 s).
QUICK_STOP = ["-c", "trap 'exit 0' TERM; echo up; while :; do sleep 1; done"]


def a_password() -> str:
    """Unique (so no other run's processes can hold it), with what a shell would expand."""
    return f"tok {uuid.uuid4().hex} $(id) `id` 'q\" \\ ;|&"


def rent(client, machine, image: str, password: str):
    return client.post(
        "/api/v1/instances/",
        {
            "machine_id": machine.pk, "num_gpus": 1, "image": image, "duration_hours": 1,
            "disk_gb": 10, "entrypoint": "sh", "args": QUICK_STOP, "ports": [],
            "registry_username": USER, "registry_password": password,
        },
        format="json",
    )  # fmt: skip


class ProcessWatch:
    """Looks at every process on this machine (the simulated host's too) each time the
    registry is asked something, i.e. while the host's login and pull are under way."""

    def __init__(self, secret: str, address: str):
        self.secret, self.address = secret.encode(), address.encode()
        self.leaks: list[str] = []
        self.pulling_seen = 0  # processes seen naming the registry: the watch saw the launch

    def __call__(self, path: str) -> None:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes()
                environ = (proc / "environ").read_bytes()
            except OSError:  # gone meanwhile
                continue
            if self.address in argv:
                self.pulling_seen += 1
            if self.secret in argv or self.secret in environ:
                self.leaks.append(argv.replace(b"\0", b" ").decode(errors="replace"))


def docker_configs_naming(address: str, *homes: str) -> list[str]:
    """Docker client configs on this machine that hold a login for ``address``: the host
    user's own, and throwaway ones (``mktemp -d``) left in /tmp."""
    candidates = [Path(home, ".docker", "config.json") for home in homes]
    candidates += Path("/tmp").glob("*/config.json")
    found = []
    for path in candidates:
        try:
            if address in path.read_text(errors="replace"):
                found.append(str(path))
        except OSError:
            continue
    return found


def image_on_engine(image: str) -> bool:
    return (
        subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0
    )


def test_a_private_image_is_pulled_with_the_renters_login_and_runs(
    funded_team, sim_host, machine, caplog
):
    caplog.set_level(logging.DEBUG)
    password = a_password()
    watch = ProcessWatch(password, "")
    registry = Registry("gpumkt/busybox:latest", username=USER, password=password, on_request=watch)
    watch.address = registry.address.encode()
    client = key_client(funded_team)
    try:
        assert not image_on_engine(registry.image)
        response = rent(client, machine, registry.image, password)
        assert response.status_code == 201, response.content
        instance = Instance.objects.get(pk=response.json()["id"])
        assert instance.state == "running", instance.status_message
        shown = client.get(f"/api/v1/instances/{instance.pk}/").json()
        marker = client.post(
            f"/api/v1/instances/{instance.pk}/exec/", {"command": f"cat {MARKER}"}, format="json"
        ).json()
    finally:
        registry.close()

    # The container runs the private image: its own file, unique to this registry's image.
    assert docker_inspect(instance.container_id)["Config"]["Image"] == registry.image
    assert marker == {"exit_code": 0, "output": registry.marker}
    assert shown["state"] == "running" and shown["status_message"] == "Container started"

    # The registry served the image only to the renter's login: the login itself (/v2/),
    # then the manifest and both blobs (config and layer), and nothing to anyone else.
    served = [r for r in registry.requests if r.status == 200]
    assert served and all(r.login == "valid" for r in served), registry.requests
    assert any(r.path == "/v2/" for r in served)
    assert any("/manifests/" in r.path for r in served)
    assert len({r.path for r in served if "/blobs/" in r.path}) == 2
    assert not [r for r in registry.requests if r.login == "invalid"]

    # The password shows nowhere: not in the API's answers, the instance's row or its events,
    # the logs, or any process's argv or environment while the login and pull ran.
    for answer in (response.content.decode(), str(shown)):
        assert "registry_password" not in answer and password not in answer
    row = Instance.objects.filter(pk=instance.pk).values().get()
    assert password not in str(row) and row["registry_credential"]["username"] == USER
    assert not [e.reason for e in instance.events.all() if password in e.reason]
    assert not [r.getMessage() for r in caplog.records if password in r.getMessage()]
    assert watch.pulling_seen, "the process watch never ran during the login and pull"
    assert watch.leaks == []
    # And the login is not left behind on the host for its other users (or the next renter).
    home = pwd.getpwnam(sim_host.user).pw_dir
    assert docker_configs_naming(registry.address, home) == []


def test_a_wrong_registry_password_fails_the_launch_and_pulls_nothing(funded_team, machine):
    right, wrong = a_password(), a_password()
    registry = Registry("gpumkt/busybox:latest", username=USER, password=right)
    client = key_client(funded_team)
    try:
        response = rent(client, machine, registry.image, wrong)
        assert response.status_code == 201, response.content
        instance = Instance.objects.get(pk=response.json()["id"])
        shown = client.get(f"/api/v1/instances/{instance.pk}/").json()
    finally:
        registry.close()

    assert instance.state == "failed"
    message = instance.status_message
    assert f"could not log in to the registry {registry.address}" in message
    assert "registry_username and registry_password" in message
    assert wrong not in message and right not in message
    assert shown["status_message"] == message and wrong not in str(shown)
    assert wrong not in str(Instance.objects.filter(pk=instance.pk).values().get())
    # The wrong login was really tried, and refused; the registry gave out nothing.
    assert any(r.login == "invalid" for r in registry.requests), registry.requests
    assert {r.status for r in registry.requests} == {401}
    assert not image_on_engine(registry.image)
    assert containers_named(instance.container_name) == []
    assert not GpuAllocation.objects.filter(instance=instance, released_at=None).exists()


def test_a_private_image_left_on_the_machine_runs_only_for_those_the_registry_admits(
    funded_team, machine
):
    """Docker keeps a pulled image for anyone on the machine: another team must not run it
    without the registry's say, with no login or a wrong one; its owner still can."""
    password = a_password()
    registry = Registry("gpumkt/busybox:latest", username=USER, password=password)
    other = TeamFactory(name="Other renters")
    add_member(other, UserFactory(username="other-owner"), Role.OWNER)
    fund(other)
    try:
        first = rent(key_client(funded_team), machine, registry.image, password).json()
        assert Instance.objects.get(pk=first["id"]).state == "running"
        assert image_on_engine(registry.image)  # left on the machine for anyone

        before = len(registry.requests)
        anonymous = key_client(other).post(
            "/api/v1/instances/",
            {"machine_id": machine.pk, "num_gpus": 1, "image": registry.image,
             "duration_hours": 1, "entrypoint": "sh", "args": QUICK_STOP},
            format="json",
        )  # fmt: skip
        refused = Instance.objects.get(pk=anonymous.json()["id"])
        assert refused.state == "failed"
        assert f"could not pull {registry.image}" in refused.status_message
        asked = registry.requests[before:]
        assert asked and {r.login for r in asked} == {""} and {r.status for r in asked} == {401}
        assert containers_named(refused.container_name) == []

        before = len(registry.requests)
        guessed = rent(key_client(other), machine, registry.image, a_password()).json()
        assert Instance.objects.get(pk=guessed["id"]).state == "failed"
        asked = registry.requests[before:]
        assert "invalid" in {r.login for r in asked} and {r.status for r in asked} == {401}

        before = len(registry.requests)
        again = rent(key_client(funded_team), machine, registry.image, password).json()
        assert Instance.objects.get(pk=again["id"]).state == "running"
        assert any(r.login == "valid" for r in registry.requests[before:])  # asked again
    finally:
        registry.close()


def test_an_image_id_prefix_is_no_way_to_a_cached_image(funded_team, machine, docker_engine):
    """Docker also looks a bare name up as the start of an image ID: a renter naming a few hex
    digits of a cached image's ID must not get that image."""
    image_id = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", docker_engine],
        capture_output=True, text=True, check=True,
    ).stdout.strip().removeprefix("sha256:")  # fmt: skip
    prefix = next(image_id[:n] for n in range(8, 64) if not image_id[:n].isdigit())
    response = key_client(funded_team).post(
        "/api/v1/instances/",
        {"machine_id": machine.pk, "num_gpus": 1, "image": prefix, "duration_hours": 1},
        format="json",
    )
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == "failed"
    assert f"could not pull {prefix}" in instance.status_message
    assert containers_named(instance.container_name) == []


def test_a_login_sealed_before_a_key_rotation_fails_the_launch_saying_so(
    funded_team, provider_team, sim_host_factory, settings
):
    """A launch whose registry password was sealed under a SECRET_KEY since retired (not kept
    in SECRET_KEY_FALLBACKS) cannot log in: it fails saying why, frees its GPU, and never asks
    the registry (a pull without the login would only say 'unauthorized')."""
    from marketplace.tasks import rental_launch
    from tests.marketplace.conftest import machine_for

    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    password = a_password()
    registry = Registry("gpumkt/busybox:latest", username=USER, password=password)
    try:
        host.stop()  # the first launch waits for the host, so the rental stays launching
        try:
            response = rent(key_client(funded_team), machine, registry.image, password)
            assert response.status_code == 201, response.content
        finally:
            host.start()
        instance = Instance.objects.get(pk=response.json()["id"])
        assert instance.state == "launching", instance.status_message
        settings.SECRET_KEY = "rotated-" + "k" * 50  # the old key is not kept as a fallback
        rental_launch.apply(args=(instance.pk,))
    finally:
        registry.close()

    instance.refresh_from_db()
    assert instance.state == "failed"
    assert "registry password can no longer be read" in instance.status_message
    assert "rent again" in instance.status_message
    assert password not in instance.status_message
    assert registry.requests == []
    assert not GpuAllocation.objects.filter(instance=instance, released_at=None).exists()
