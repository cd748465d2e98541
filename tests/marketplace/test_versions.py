"""Versions of a rental on a real host: a PATCH runs a new container beside the stopped old
one, rollback runs an old spec again, old versions are deleted or destroyed with the rental,
and a committed image is the team's own on that machine."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import Hold
from hosts.devtools.sim_docker import SSH_IMAGE, ensure_ssh_image
from marketplace.models import CommittedImage, Rental
from marketplace.rentals.metering import rental_owed
from marketplace.services.pricing import storage_owed
from scheduler.models import GpuAllocation, Instance, PortAllocation
from tests.conftest import client_for, key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import containers_named, docker, docker_inspect, fund
from tests.marketplace.test_rental_lifecycle import rented

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def env_of(container: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in docker_inspect(container)["Config"]["Env"])


def test_versions_rollback_delete_and_commit(funded_team, owner, machine):
    ensure_ssh_image()
    client = key_client(funded_team)
    first = rented(client, machine, env={"MODE": "one"})
    base = f"/api/v1/instances/{first.pk}/"
    name = first.container_name

    patched = client.patch(base, {"env": {"MODE": "two"}, "image": SSH_IMAGE}, format="json")
    assert patched.status_code == 202, patched.content
    second = Instance.objects.get(pk=first.pk)
    assert (second.state, second.version, second.container_name) == ("running", 2, f"{name}-2")
    assert env_of(second.container_id)["MODE"] == "two"
    assert docker_inspect(second.container_id)["Config"]["Image"] == SSH_IMAGE
    assert docker_inspect(first.container_id)["State"]["Status"] == "exited"  # kept, stopped
    unknown = client.patch(base, {"gpu_name": "A100"}, format="json")
    assert unknown.status_code == 400 and "gpu_name" in unknown.json()["error"]["fields"]
    page = client_for(Client(), owner, funded_team).get(f"/instances/{first.pk}/").content.decode()
    assert "<del>MODE=one</del> → <ins>MODE=two</ins>" in page and 'data-version="1"' in page

    versions = client.get(f"{base}versions/").json()
    assert [(v["number"], v["state"], v["changed"]) for v in versions] == [
        (1, "stopped", []),
        (2, "running", ["env", "image"]),
    ]
    rolled = client.post(f"{base}rollback/", {"version": 1}, format="json")
    assert rolled.status_code == 202, rolled.content
    third = Instance.objects.get(pk=first.pk)
    assert third.version == 3 and env_of(third.container_id)["MODE"] == "one"
    assert docker_inspect(third.container_id)["Config"]["Image"] == "gpumkt/busybox:latest"
    assert client.delete(f"{base}versions/3/").status_code == 409  # the current one
    assert client.delete(f"{base}versions/1/").status_code == 204
    assert containers_named(name) == [] and containers_named(f"{name}-2")
    assert [v["number"] for v in client.get(f"{base}versions/").json()] == [2, 3]

    # More GPUs: taken on the machine, held for, charged from now on.
    hold_before = Hold.objects.get(pk=Rental.objects.get(instance=first).hold_id).amount
    assert client.patch(base, {"num_gpus": 9}, format="json").status_code == 400
    assert client.patch(base, {"num_gpus": 3}, format="json").status_code == 202
    fourth = Instance.objects.get(pk=first.pk)
    assert (fourth.version, fourth.gpu_count, fourth.state) == (4, 3, "running")
    assert len(env_of(fourth.container_id)["NVIDIA_VISIBLE_DEVICES"].split(",")) == 3
    assert GpuAllocation.objects.filter(instance=first, released_at=None).count() == 3
    rental = Rental.objects.get(instance=first)
    assert Hold.objects.get(pk=rental.hold_id).amount > hold_before
    now = timezone.now()
    hour = rental_owed(rental, now + timedelta(hours=1)).gpu - rental_owed(rental, now).gpu
    assert hour == 3 * rental.price_per_gpu_hour

    committed = client.post(f"{base}commit/", {"repository": "trainer", "tag": "v1"}, format="json")
    assert committed.status_code == 201, committed.content
    image = committed.json()["image"]
    assert image == f"gpumkt-team-{funded_team.pk}/trainer:v1"
    listed = client.get("/api/v1/images/").json()["results"]
    assert [(i["reference"], i["machine_id"]) for i in listed] == [(image, machine.pk)]
    try:
        assert docker("image", "inspect", image, check=False).returncode == 0
        mine = rented(client, machine, image=image)
        short = client.patch(base, {"num_gpus": 4}, format="json")  # the 4th is mine's
        assert short.status_code == 409 and "1 more GPU(s)" in short.json()["error"]["message"]
        assert Instance.objects.get(pk=first.pk).state == "running"
        assert docker_inspect(mine.container_id)["Config"]["Image"] == image
        other = TeamFactory(name="Other")
        add_member(other, UserFactory(username="other-owner"), "owner")
        fund(other)
        theirs = key_client(other).post(
            "/api/v1/instances/",
            {"machine_id": machine.pk, "num_gpus": 1, "image": image, "duration_hours": 1},
            format="json",
        )
        assert theirs.status_code == 400 and "image" in theirs.json()["error"]["fields"]

        # Destroying the rental removes every version's container.
        assert client.delete(base).status_code == 202
        assert containers_named(f"{name}-2") == [] and containers_named(f"{name}-3") == []
    finally:
        CommittedImage.objects.all().delete()
        docker("rmi", "--force", image, check=False)


def test_a_version_that_cannot_start_gives_way_to_the_one_before(funded_team, owner, machine):
    """Version 2 asks for a command the image lacks and one more GPU: Docker refuses it on the
    real host, version 1's container runs again on its one GPU, the rental carries on, and the
    failure is in the versions list, the events and the console."""
    client = key_client(funded_team)
    first = rented(client, machine, env={"MODE": "one"})
    base = f"/api/v1/instances/{first.pk}/"
    patched = client.patch(base, {"entrypoint": "/no/such/program", "num_gpus": 2}, format="json")
    assert patched.status_code == 202, patched.content

    back = Instance.objects.get(pk=first.pk)
    assert (back.state, back.version, back.gpu_count) == ("running", 1, 1), back.status_message
    assert (
        back.container_id == first.container_id
        and docker_inspect(first.container_id)["State"]["Running"]
    )
    assert containers_named(f"{first.container_name}-2") == []  # the failed one is removed
    assert "Version 2 did not start" in back.status_message
    assert "version 1 runs again" in back.status_message
    assert GpuAllocation.objects.filter(instance=first, released_at=None).count() == 1
    rental = Rental.objects.get(instance=first)
    assert rental.settled_at is None and rental.gpu_count == 1
    assert Hold.objects.get(pk=rental.hold_id).status == "open"
    now = timezone.now()
    hour = rental_owed(rental, now + timedelta(hours=1)).gpu - rental_owed(rental, now).gpu
    assert hour == rental.price_per_gpu_hour  # one GPU again

    shown = client.get(base).json()
    assert shown["state"] == "running" and "did not start" in shown["status_message"]
    versions = client.get(f"{base}versions/").json()
    assert [(v["number"], v["state"], v["current"]) for v in versions] == [
        (1, "running", True),
        (2, "failed", False),
    ]
    assert "/no/such/program" in versions[1]["failure"]
    page = client_for(Client(), owner, funded_team).get(f"/instances/{first.pk}/").content.decode()
    assert "data-version-failure" in page and "did not start" in page

    # The next version gets a new number, and it runs.
    again = client.patch(base, {"env": {"MODE": "three"}}, format="json")
    assert again.status_code == 202, again.content
    third = Instance.objects.get(pk=first.pk)
    assert (third.state, third.version) == ("running", 3), third.status_message
    assert env_of(third.container_id)["MODE"] == "three"
    assert client.delete(f"{base}versions/2/").status_code == 204
    assert [v["number"] for v in client.get(f"{base}versions/").json()] == [1, 3]

    # A failed version that gave a GPU back: the one before gets that very GPU again.
    assert client.patch(base, {"num_gpus": 2}, format="json").status_code == 202
    two = Instance.objects.get(pk=first.pk)
    held = set(GpuAllocation.objects.filter(instance=first, released_at=None).values_list(
        "gpu_id", flat=True
    ))  # fmt: skip
    assert (two.version, len(held)) == (4, 2)
    fewer = client.patch(base, {"num_gpus": 1, "entrypoint": "/no/such"}, format="json")
    assert fewer.status_code == 202, fewer.content
    back = Instance.objects.get(pk=first.pk)
    assert (back.state, back.version, back.gpu_count) == ("running", 4, 2), back.status_message
    assert back.container_id == two.container_id
    live = GpuAllocation.objects.filter(instance=first, released_at=None)
    assert set(live.values_list("gpu_id", flat=True)) == held
    assert Rental.objects.get(instance=first).gpu_count == 2


def live_ports(instance: Instance) -> dict[int, int]:
    rows = PortAllocation.objects.filter(instance=instance, released_at=None)
    return dict(rows.values_list("container_port", "host_port"))


def published(container: str) -> dict[int, int]:
    bindings = docker_inspect(container)["HostConfig"]["PortBindings"] or {}
    return {int(k.split("/")[0]): int(v[0]["HostPort"]) for k, v in bindings.items()}


def test_a_version_publishes_other_ports_and_changes_its_disk(funded_team, machine):
    """Ports: a kept port keeps its host port, a new one gets one from the machine's range, a
    dropped one is released. Disk: the new size is charged from now (the time before at the
    old size), the hold grows for the rest of the period, and an enforcing host caps it. A
    version that fails gives its ports back to the one before."""
    client = key_client(funded_team)
    first = rented(client, machine, ports=[8080])
    base = f"/api/v1/instances/{first.pk}/"
    before = live_ports(first)
    rental = Rental.objects.get(instance=first)
    hold_before = Hold.objects.get(pk=rental.hold_id).amount

    too_big = client.patch(base, {"disk_gb": 99_999}, format="json")
    assert too_big.status_code == 400 and "disk_gb" in too_big.json()["error"]["fields"]
    bad = client.patch(base, {"ports": [0]}, format="json")
    assert bad.status_code == 400 and "ports" in bad.json()["error"]["fields"]
    assert Instance.objects.get(pk=first.pk).version == 1  # nothing written

    patched = client.patch(base, {"ports": [8080, 9000], "disk_gb": 20}, format="json")
    assert patched.status_code == 202, patched.content
    second = Instance.objects.get(pk=first.pk)
    assert (second.state, second.version, second.disk_gb) == ("running", 2, 20)
    ports = live_ports(second)
    assert ports[8080] == before[8080]
    assert machine.port_range_start <= ports[9000] <= machine.port_range_end
    assert published(second.container_id) == ports
    if machine.disk_enforced:
        assert docker_inspect(second.container_id)["HostConfig"]["StorageOpt"] == {"size": "20G"}
    rental = Rental.objects.get(instance=first)
    assert rental.disk_gb == 20 and rental.storage_owed_banked >= 0
    # Storage is rounded once from its clock's seconds, so an hour from `now` costs what 20 GB
    # owe for the clock's reading at `now` plus an hour, less what they owe at `now`: one
    # instant read once (the hour alone, rounded on its own, can differ by a micro-dollar).
    now = timezone.now()
    seconds = rental.storage_seconds_at(now)

    def at_20_gb(seconds: int) -> int:
        return storage_owed(
            price_per_gb_month=rental.storage_price_per_gb_month, disk_gb=20, seconds=seconds
        )

    hour = rental_owed(rental, now + timedelta(hours=1)).storage - rental_owed(rental, now).storage
    assert hour == at_20_gb(seconds + 3600) - at_20_gb(seconds)
    grown = Hold.objects.get(pk=rental.hold_id).amount - hold_before
    assert (
        0
        < grown
        <= storage_owed(
            price_per_gb_month=rental.storage_price_per_gb_month, disk_gb=10, seconds=2 * 3600
        )
    )
    versions = client.get(f"{base}versions/").json()
    assert versions[-1]["changed"] == ["disk_gb", "ports"]

    dropped = client.patch(base, {"ports": [9000]}, format="json")
    assert dropped.status_code == 202, dropped.content
    third = Instance.objects.get(pk=first.pk)
    assert live_ports(third) == {9000: ports[9000]}
    assert published(third.container_id) == {9000: ports[9000]}
    assert (
        PortAllocation.objects.filter(instance=first, container_port=8080)
        .exclude(released_at=None)
        .exists()
    )

    # A version that cannot start: version 3 runs again on its own host port.
    failing = client.patch(base, {"ports": [7000], "entrypoint": "/no/such"}, format="json")
    assert failing.status_code == 202, failing.content
    back = Instance.objects.get(pk=first.pk)
    assert (back.state, back.version) == ("running", 3), back.status_message
    assert live_ports(back) == {9000: ports[9000]}
    assert published(back.container_id) == {9000: ports[9000]}
    assert docker_inspect(back.container_id)["State"]["Running"]
    failed = client.get(f"{base}versions/").json()[-1]
    assert (failed["state"], failed["spec"]["ports"]) == ("failed", [7000])
