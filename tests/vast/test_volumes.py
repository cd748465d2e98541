"""``vastai search/create/show/delete volume(s)`` and ``create instance --create-volume /
--link-volume`` on a real host; the bodies are the CLI 1.9.1's (vastai/api/storage.py,
vastai/api/offers.py search_volumes, vastai/api/instances.py build_volume_info)."""

from __future__ import annotations

import pytest

from hosts.runtime.volumes import HostVolumes
from marketplace.models import Offer, Role, Volume, VolumeState
from tests.conftest import key_client, sim_container_label
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund, remove_containers

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

SEARCH_DEFAULTS = {
    "verified": {"eq": True},
    "external": {"eq": False},
    "disk_space": {"gte": 1},
    "order": [["score", "desc"]],
    "allocated_storage": 1.0,
}


@pytest.fixture(autouse=True)
def _no_volume_left_on_the_host():
    yield
    left = list(Volume.objects.exclude(state=VolumeState.DELETED).select_related("machine"))
    if left:
        remove_containers(sim_container_label())
    for volume in left:
        HostVolumes(volume.machine).remove(volume.docker_name)


def offer_of(machine) -> int:
    return Offer.objects.filter(machine_id=machine.pk).order_by("num_gpus").first().pk


def run(client, instance_id: int, command: str) -> dict:
    done = client.put(
        f"/api/v0/instances/command/{instance_id}/", {"command": command}, format="json"
    )
    assert done.status_code == 200, done.content
    return done.json()


def test_a_volume_offer_is_a_machines_free_disk_and_a_volume_is_made_there(funded_team, machine):
    client = key_client(funded_team)
    found = client.post("/api/v0/volumes/search/", SEARCH_DEFAULTS, format="json")
    assert found.status_code == 200, found.content
    [offer] = [row for row in found.json()["offers"] if row["id"] == machine.pk]
    assert offer["machine_id"] == machine.pk and offer["disk_space"] == machine.disk_free_gb
    assert offer["storage_cost"] == machine.storage_price_per_gb_month / 1_000_000
    too_big = client.post(
        "/api/v0/volumes/search/",
        {**SEARCH_DEFAULTS, "disk_space": {"gt": machine.disk_free_gb}},
        format="json",
    )
    assert too_big.status_code == 200 and too_big.json()["offers"] == []

    made = client.put(
        "/api/v0/volumes/", {"size": 1, "id": machine.pk, "name": "data"}, format="json"
    )
    assert made.status_code == 200 and made.json()["success"], made.content
    volume = Volume.objects.get(pk=made.json()["volume_id"])
    assert (volume.team, volume.machine, volume.size_gb) == (funded_team, machine, 1)
    assert volume.state == VolumeState.READY
    again = client.post("/api/v0/volumes/search/", SEARCH_DEFAULTS, format="json")
    [offer] = [row for row in again.json()["offers"] if row["id"] == machine.pk]
    assert offer["disk_space"] == machine.disk_free_gb - 1  # promised to the volume

    shown = client.get("/api/v0/volumes", {"owner": "me", "type": "all_volume"})
    [row] = shown.json()["volumes"]
    assert (row["id"], row["label"], row["disk_space"], row["status"]) == (
        volume.pk, "data", 1.0, "ready",
    )  # fmt: skip
    assert row["start_date"] > 0 and row["instances"] == []

    linked = client.put(
        f"/api/v0/asks/{offer_of(machine)}/",
        {
            "image": "gpumkt/busybox:latest",
            "runtype": "args",
            "onstart": "sleep",
            "args": ["600"],
            "volume_info": {"create_new": False, "volume_id": volume.pk, "mount_path": "/data"},
        },
        format="json",
    )
    assert linked.status_code == 200, linked.content
    first = linked.json()["new_contract"]
    assert run(client, first, "echo kept > /data/f && cat /data/f")["output"].strip() == "kept"
    in_use = client.delete("/api/v0/volumes/", QUERY_STRING=f"id={volume.pk}")
    assert in_use.status_code == 409 and str(first) in in_use.json()["msg"]
    assert client.delete(f"/api/v0/instances/{first}/").status_code == 200

    # --create-volume: a new volume on the instance's own machine, mounted at once.
    created = client.put(
        f"/api/v0/asks/{offer_of(machine)}/",
        {
            "image": "gpumkt/busybox:latest",
            "runtype": "args",
            "onstart": "sleep",
            "args": ["600"],
            "volume_info": {
                "create_new": True,
                "volume_id": machine.pk,
                "size": 1,
                "mount_path": "/scratch",
                "name": "scratch",
            },
        },  # fmt: skip
        format="json",
    )
    assert created.status_code == 200, created.content
    second = created.json()["new_contract"]
    scratch = Volume.objects.get(team=funded_team, name="scratch")
    assert scratch.mounts.get().instance_id == second
    assert run(client, second, "df -P /scratch | tail -1")["exit_code"] == 0
    assert client.delete(f"/api/v0/instances/{second}/").status_code == 200

    gone = client.delete("/api/v0/volumes/", QUERY_STRING=f"id={volume.pk}")
    assert gone.status_code == 200 and gone.json()["success"], gone.content
    assert Volume.objects.get(pk=volume.pk).state in (VolumeState.REMOVING, VolumeState.DELETED)


def test_volume_requests_that_cannot_be_honoured_write_nothing(funded_team, machine):
    client = key_client(funded_team)
    refusals = [
        ({"size": 1, "id": "x"}, "id"),
        ({"size": -1, "id": machine.pk}, "size"),
        ({"size": 1.5, "id": machine.pk}, "size"),
        ({"size": 10**12, "id": machine.pk}, "size"),
        ({"size": 1, "id": 2**63}, "id"),
        ({"size": 1, "id": machine.pk, "name": {"x": 1}}, "name"),
        ({"size": machine.disk_free_gb + 1, "id": machine.pk}, "size_gb"),
    ]
    for body, field in refusals:
        answer = client.put("/api/v0/volumes/", body, format="json")
        assert answer.status_code == 400, (body, answer.content)
        assert answer.json()["success"] is False and field in answer.json()["error"]["fields"]
    unknown = client.post("/api/v0/volumes/search/", {"gpu_nmae": {"eq": "x"}}, format="json")
    assert unknown.status_code == 400 and "gpu_nmae" in unknown.json()["msg"]
    clone = client.post("/api/v0/volumes/copy/", {"src_id": 1, "dst_id": machine.pk}, format="json")
    assert clone.status_code == 404 and "not one of your team's volumes" in clone.json()["msg"]
    elsewhere = client.put(
        f"/api/v0/asks/{offer_of(machine)}/",
        {
            "image": "gpumkt/busybox:latest",
            "volume_info": {
                "create_new": True,
                "volume_id": machine.pk + 1000,
                "size": 1,
                "mount_path": "/data",
            },
        },  # fmt: skip
        format="json",
    )
    assert elsewhere.status_code == 400 and "create-volume" in elsewhere.json()["error"]["fields"]
    assert not Volume.objects.exists()


def test_another_teams_volume_is_not_there(funded_team, machine):
    other = TeamFactory(name="Other")
    add_member(other, UserFactory(), Role.OWNER)
    fund(other)
    theirs = key_client(other).put("/api/v0/volumes/", {"size": 1, "id": machine.pk}, format="json")
    assert theirs.status_code == 200, theirs.content
    volume_id = theirs.json()["volume_id"]
    client = key_client(funded_team)
    assert client.get("/api/v0/volumes").json()["volumes"] == []
    deleting = client.delete("/api/v0/volumes/", QUERY_STRING=f"id={volume_id}")
    assert deleting.status_code == 404 and deleting.json()["success"] is False
    linking = client.put(
        f"/api/v0/asks/{offer_of(machine)}/",
        {
            "image": "gpumkt/busybox:latest",
            "volume_info": {"create_new": False, "volume_id": volume_id, "mount_path": "/data"},
        },
        format="json",
    )
    assert linking.status_code == 400 and "no volume" in linking.json()["msg"]
    assert Volume.objects.get(pk=volume_id).state == VolumeState.READY
    assert not Volume.objects.filter(team=funded_team).exists()


def test_a_clone_is_a_new_volume_with_the_files_and_its_own_size(funded_team, machine, tmp_path):
    client = key_client(funded_team)
    made = client.put(
        "/api/v0/volumes/", {"size": 1, "id": machine.pk, "name": "src"}, format="json"
    )
    source = Volume.objects.get(pk=made.json()["volume_id"])
    first = mount(client, machine, source.pk)
    marker = tmp_path / "owned"  # what a name run by a shell would make, here or in a container
    odd = f"a;b $(touch {marker}) *"  # quoted with '' in the renter's own commands below
    wrote = run(client, first, f"mkdir -p '/data/{odd}' && echo kept > '/data/{odd}/f'")
    assert wrote["exit_code"] == 0, wrote
    assert client.delete(f"/api/v0/instances/{first}/").status_code == 200

    refusals = [
        ({"src_id": source.pk, "dst_id": machine.pk + 1000}, "dst_id"),
        ({"src_id": source.pk, "dst_id": machine.pk, "size": 0.5}, "size"),
        ({"src_id": "x", "dst_id": machine.pk}, "src_id"),
    ]
    for body, field in refusals:
        answer = client.post("/api/v0/volumes/copy/", body, format="json")
        assert answer.status_code == 400 and field in answer.json()["error"]["fields"], body
    assert Volume.objects.filter(team=funded_team).count() == 1  # nothing written

    cloned = client.post(
        "/api/v0/volumes/copy/",
        {"src_id": source.pk, "dst_id": machine.pk, "size": 2},
        format="json",
    )
    assert cloned.status_code == 200 and cloned.json()["success"], cloned.content
    clone = Volume.objects.get(pk=cloned.json()["volume_id"])
    assert (clone.team, clone.machine, clone.size_gb, clone.cloned_from) == (
        funded_team, machine, 2, source,
    )  # fmt: skip
    assert clone.state == VolumeState.READY, clone.failure
    assert HostVolumes(machine).usage(clone.docker_name).size_bytes > 1.5 * 2**30
    second = mount(client, machine, clone.pk)
    assert run(client, second, f"cat '/data/{odd}/f'")["output"].strip() == "kept"
    assert run(client, second, f"test -e {marker}")["exit_code"] == 1 and not marker.exists()
    # The clone is its own volume: writing it leaves the source as it was.
    run(client, second, f"echo changed > '/data/{odd}/f'")
    assert client.delete(f"/api/v0/instances/{second}/").status_code == 200
    third = mount(client, machine, source.pk)
    assert run(client, third, f"cat '/data/{odd}/f'")["output"].strip() == "kept"
    assert client.delete(f"/api/v0/instances/{third}/").status_code == 200

    other = TeamFactory(name="Other")
    add_member(other, UserFactory(), Role.OWNER)
    fund(other)
    theirs = key_client(other).post(
        "/api/v0/volumes/copy/", {"src_id": source.pk, "dst_id": machine.pk}, format="json"
    )
    assert theirs.status_code == 404 and not Volume.objects.filter(team=other).exists()
    via_v1 = client.post(f"/api/v1/volumes/{source.pk}/clone/", {"name": "again"}, format="json")
    assert via_v1.status_code == 201 and via_v1.json()["cloned_from"] == source.pk, via_v1.content
    assert via_v1.json()["size_gb"] == 1
    smaller = client.post(
        f"/api/v1/volumes/{clone.pk}/clone/", {"name": "small", "size_gb": 1}, format="json"
    )
    assert smaller.status_code == 400 and "size_gb" in smaller.json()["error"]["fields"]


def mount(client, machine, volume_id: int) -> int:
    rented = client.put(
        f"/api/v0/asks/{offer_of(machine)}/",
        {
            "image": "gpumkt/busybox:latest",
            "runtype": "args",
            "onstart": "sleep",
            "args": ["600"],
            "volume_info": {"create_new": False, "volume_id": volume_id, "mount_path": "/data"},
        },
        format="json",
    )
    assert rented.status_code == 200, rented.content
    return rented.json()["new_contract"]
