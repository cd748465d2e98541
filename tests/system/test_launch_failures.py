"""Why a launch failed, as the renter reads it, with real Docker behind a simulated host: an
image the machine lacks is pulled; a command the image cannot run fails with that reason and
pulls nothing; a registry on the machine's own network is refused, at rent time and again on
the worker right before a pull."""

# ruff: noqa: F811 - the rental fixtures are imported from tests.marketplace.conftest
from __future__ import annotations

import socket
import subprocess

import pytest

from marketplace.tasks import rental_launch
from scheduler.models import GpuAllocation, Instance
from tests.conftest import key_client
from tests.marketplace.conftest import (  # noqa: F401 - fixtures used by name
    _label_test_containers,
    containers_named,
    docker_inspect,
    funded_team,
    machine,
    machine_for,
    provider_team,
)
from tests.marketplace.registry import Registry

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

BASE_IMAGE = "gpumkt/busybox:latest"
MARKER = "/etc/gpumkt-pull-test"  # the file the test registry adds to its image


def rent(client, machine, image: str, **overrides):
    return client.post(
        "/api/v1/instances/",
        {
            "machine_id": machine.pk, "num_gpus": 1, "image": image, "duration_hours": 1,
            "disk_gb": 5, "entrypoint": "sh", "args": ["-c", "exec sleep 600"], **overrides,
        },
        format="json",
    )  # fmt: skip


def image_on_engine(image: str) -> bool:
    found = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
    return found.returncode == 0


def manifests_served(registry: Registry) -> int:
    return sum(1 for r in registry.requests if "/manifests/" in r.path)


@pytest.fixture
def registry():
    served = Registry(BASE_IMAGE)
    yield served
    served.close()  # also removes its image from the engine


def test_an_image_the_machine_lacks_is_pulled_then_run(funded_team, machine, registry):
    assert not image_on_engine(registry.image)
    client = key_client(funded_team)
    response = rent(client, machine, registry.image)
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == "running", instance.status_message
    assert manifests_served(registry) >= 1  # really pulled from the registry
    # The container runs the pulled image: its own file is there.
    marker = client.post(
        f"/api/v1/instances/{instance.pk}/exec/", {"command": f"cat {MARKER}"}, format="json"
    ).json()
    assert marker == {"exit_code": 0, "output": registry.marker}


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        # The case: args [1, 2] with no entrypoint make "1" the command.
        ({"entrypoint": "", "args": ["1", "2"]}, "executable '1' not found in the image"),
        ({"entrypoint": "/no/such/program", "args": []}, "executable '/no/such/program' not found"),
        ({"entrypoint": "/etc/passwd", "args": []}, "'/etc/passwd' cannot be run in the image"),
    ],
)
def test_a_command_the_image_cannot_run_fails_with_that_reason_and_pulls_nothing(
    funded_team, machine, registry, overrides, reason
):
    # The image is on the machine (pulled directly, not through our code); a pull now would
    # ask the registry for its manifest again.
    subprocess.run(["docker", "pull", registry.image], check=True, capture_output=True)
    served_before = manifests_served(registry)
    client = key_client(funded_team)
    response = rent(client, machine, registry.image, **overrides)
    assert response.status_code == 201, response.content
    body = client.get(f"/api/v1/instances/{response.json()['id']}/").json()
    assert body["state"] == "failed"
    assert reason in body["status_message"], body["status_message"]
    assert "pull" not in body["status_message"]
    assert manifests_served(registry) == served_before  # nothing was pulled
    instance = Instance.objects.get(pk=body["id"])
    assert containers_named(instance.container_name) == []  # the Created container is gone
    assert not GpuAllocation.objects.filter(instance=instance, released_at=None).exists()


def test_a_host_port_taken_by_another_program_fails_with_dockers_reason_and_pulls_nothing(
    funded_team, sim_host_factory, provider_team
):
    """docker run exits 125 having made the container: it is not taken for a missing image,
    and nothing is left behind."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    squatter = socket.create_server(("0.0.0.0", machine.port_range_start))  # the first picked
    try:
        response = rent(key_client(funded_team), machine, BASE_IMAGE, ports=[8080])
        assert response.status_code == 201, response.content
        instance = Instance.objects.get(pk=response.json()["id"])
    finally:
        squatter.close()
    assert instance.state == "failed"
    assert "address already in use" in instance.status_message, instance.status_message
    assert "pull" not in instance.status_message
    assert containers_named(instance.container_name) == []
    assert not GpuAllocation.objects.filter(instance=instance, released_at=None).exists()


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("10.0.0.7:5000/team/model:1", "a private address"),
        ("192.168.1.20/team/model:1", "a private address"),
        ("172.16.0.1:443/x:1", "a private address"),
        ("169.254.169.254/latest:1", "a link-local address"),
        ("0.0.0.0:5000/x:1", "an unspecified address"),
        ("127.0.0.1:5000/x:1", "a loopback address"),
        ("localhost:5000/x:1", "a loopback address"),
    ],
)
def test_a_registry_on_the_machines_own_network_is_refused_at_rent_time(
    funded_team, machine, settings, image, why
):
    settings.REGISTRY_ALLOW_LOOPBACK = False  # production: loopback is the machine itself
    response = rent(key_client(funded_team), machine, image)
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert why in str(fields["image"]) and "does not allow private registries" in str(fields)
    assert Instance.objects.count() == 0


def test_a_provider_can_allow_registries_on_its_own_network(
    funded_team, machine, registry, settings
):
    # The simulated host is reached on loopback; its registries are refused there.
    settings.REGISTRY_ALLOW_LOOPBACK = False
    machine.allow_private_registries = True
    machine.save(update_fields=["allow_private_registries"])
    response = rent(key_client(funded_team), machine, registry.image)
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == "running", instance.status_message
    assert docker_inspect(instance.container_id)["Config"]["Image"] == registry.image


def test_the_worker_checks_the_registry_again_right_before_pulling(
    funded_team, machine, registry, settings
):
    """Allowed when rented; by the time a launch pulls, the provider no longer allows it (or
    the registry's name points somewhere else): the host never speaks to the registry."""
    # The simulated host is reached on loopback; its registries are refused there.
    settings.REGISTRY_ALLOW_LOOPBACK = False
    machine.allow_private_registries = True
    machine.save(update_fields=["allow_private_registries"])
    response = rent(key_client(funded_team), machine, registry.image)
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == "running", instance.status_message
    # Its launch is delivered again, with the container and the image gone from the machine.
    subprocess.run(["docker", "rm", "--force", instance.container_id], capture_output=True)
    subprocess.run(["docker", "image", "rm", "--force", registry.image], capture_output=True)
    machine.allow_private_registries = False
    machine.save(update_fields=["allow_private_registries"])
    Instance.objects.filter(pk=instance.pk).update(state="launching", container_id="")
    served_before = len(registry.requests)
    assert rental_launch(instance.pk) == "failed"
    instance.refresh_from_db()
    assert "image: the registry" in instance.status_message
    assert "a loopback address" in instance.status_message
    assert len(registry.requests) == served_before  # the host never asked the registry
    assert not image_on_engine(registry.image)
