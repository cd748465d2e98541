"""Volumes on a real host: data outlives a rental, the size is a real limit that grows and
shrinks, a team's volumes are its own, and the money follows the hold rules."""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import Hold
from hosts.runtime.volumes import VOLUME_DIR, HostVolumes
from marketplace.models import Volume, VolumeState
from marketplace.models.volumes import volume_reference
from marketplace.rentals.volume_metering import volumes_meter_sweep
from marketplace.services.pricing import storage_owed
from tests.conftest import client_for, key_client, sim_container_label
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import (
    STORAGE_PER_GB_MONTH,
    fund,
    machine_for,
    remove_containers,
)
from tests.marketplace.test_rental_lifecycle import rented

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _no_volume_left_on_the_host():
    """A test that fails midway leaves no loop-mounted image behind: its containers go first
    (they hold the volume), then the volume's image and mount."""
    yield
    left = list(Volume.objects.exclude(state=VolumeState.DELETED).select_related("machine"))
    if left:
        remove_containers(sim_container_label())
    for volume in left:
        HostVolumes(volume.machine).remove(volume.docker_name)


FILL = "rm -f /data/big; dd if=/dev/zero of=/data/big bs=1M count=1100 2>&1"


def run(client, instance, command: str) -> dict:
    response = client.post(
        f"/api/v1/instances/{instance.pk}/exec/", {"command": command}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_a_volume_outlives_its_rental_and_its_size_is_enforced(funded_team, owner, machine):
    client = key_client(funded_team)
    made = client.post(
        "/api/v1/volumes/",
        {"machine_id": machine.pk, "name": "datasets", "size_gb": 1, "duration_hours": 24},
        format="json",
    )
    assert made.status_code == 201, made.content
    volume = Volume.objects.get(pk=made.json()["id"])
    hold = Hold.objects.get(pk=volume.hold_id)
    assert hold.reference == volume_reference(volume.pk) and hold.status == "open"
    on_host = os.path.join(VOLUME_DIR, volume.docker_name)
    assert os.path.ismount(on_host)
    # Charged per GB-second from its own hold, once however often the sweep runs.
    later = timezone.now() + timedelta(hours=1)
    assert volumes_meter_sweep(now=later) > 0 and volumes_meter_sweep(now=later) == 0
    seconds = int((later - volume.clock_since).total_seconds())
    assert Hold.objects.get(pk=volume.hold_id).captured_storage == storage_owed(
        price_per_gb_month=STORAGE_PER_GB_MONTH, disk_gb=1, seconds=seconds
    )

    mount = {"volumes": [{"volume": volume.pk, "target": "/data"}]}
    first = rented(client, machine, **mount)
    wrote = run(client, first, "head -c 1048576 /dev/urandom > /data/f && md5sum /data/f")
    assert wrote["exit_code"] == 0, wrote
    deleting = client.delete(f"/api/v1/volumes/{volume.pk}/")
    assert deleting.status_code == 409 and str(first.pk) in deleting.json()["error"]["message"]
    assert client.delete(f"/api/v1/instances/{first.pk}/").status_code == 202

    second = rented(client, machine, **mount)
    page = client_for(Client(), owner, funded_team).get("/volumes/").content.decode()
    assert "datasets" in page and f'href="/instances/{second.pk}/"' in page
    assert run(client, second, "md5sum /data/f")["output"] == wrote["output"]
    full = run(client, second, FILL)
    assert full["exit_code"] != 0 and "No space left on device" in full["output"], full

    grown = client.patch(f"/api/v1/volumes/{volume.pk}/", {"size_gb": 2}, format="json")
    assert grown.status_code == 200 and grown.json()["version"] == 2, grown.content
    fits = run(client, second, FILL)
    assert fits["exit_code"] == 0, fits
    assert Hold.objects.get(pk=volume.hold_id).amount > hold.amount  # the extra GB is held
    refused = client.patch(f"/api/v1/volumes/{volume.pk}/", {"size_gb": 1}, format="json")
    assert refused.status_code == 400 and "size_gb" in refused.json()["error"]["fields"]
    run(client, second, "rm /data/big")
    shrunk = client.patch(f"/api/v1/volumes/{volume.pk}/", {"size_gb": 1}, format="json")
    assert shrunk.status_code == 200, shrunk.content
    versions = client.get(f"/api/v1/volumes/{volume.pk}/versions/").json()
    assert [(v["number"], v["size_gb"]) for v in versions] == [(1, 1), (2, 2), (3, 1)]
    assert run(client, second, "md5sum /data/f")["output"] == wrote["output"]

    # A new version of the rental without the volume, then a rollback that mounts it again.
    plain = client.patch(f"/api/v1/instances/{second.pk}/", {"volumes": []}, format="json")
    assert plain.status_code == 202, plain.content
    assert run(client, second, "test -e /data/f")["exit_code"] != 0
    assert client.get(f"/api/v1/volumes/{volume.pk}/").json()["mounted_by"] == []
    back = client.post(f"/api/v1/instances/{second.pk}/rollback/", {"version": 1}, format="json")
    assert back.status_code == 202, back.content
    assert run(client, second, "md5sum /data/f")["output"] == wrote["output"]
    assert client.get(f"/api/v1/volumes/{volume.pk}/").json()["mounted_by"] == [second.pk]

    # Another team sees nothing of it and cannot mount it.
    other = TeamFactory(name="Other")
    add_member(other, UserFactory(username="other-owner"), "owner")
    fund(other)
    stranger = key_client(other)
    assert stranger.get(f"/api/v1/volumes/{volume.pk}/").status_code == 404
    assert stranger.get("/api/v1/volumes/").json()["results"] == []
    taken = stranger.post(
        "/api/v1/instances/",
        {"machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
         "duration_hours": 1, **mount},
        format="json",
    )  # fmt: skip
    assert taken.status_code == 400 and "volumes" in taken.json()["error"]["fields"]

    assert client.delete(f"/api/v1/instances/{second.pk}/").status_code == 202
    assert client.delete(f"/api/v1/volumes/{volume.pk}/").status_code == 204
    volume.refresh_from_db()
    assert volume.state == VolumeState.DELETED
    assert Hold.objects.get(pk=volume.hold_id).status == "released"
    assert not os.path.exists(on_host) and not os.path.exists(on_host + ".img")
    names = subprocess.run(
        ["docker", "volume", "ls", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert volume.docker_name not in names


def test_volumes_fit_the_hosts_disk_end_with_their_period_and_are_then_deleted(
    funded_team, owner, machine
):
    """Sizes promised past the disk the probe found free are refused (images are sparse: they
    would fill the host for everyone later); a volume whose period ended mounts no more, and
    the expiry sweep deletes it once the data grace period is over."""
    from marketplace.tasks import expiry_sweep

    client = key_client(funded_team)
    body = {"machine_id": machine.pk, "name": "big", "duration_hours": 24}
    too_big = client.post("/api/v1/volumes/", {**body, "size_gb": machine.disk_free_gb + 1},
                          format="json")  # fmt: skip
    assert too_big.status_code == 400
    assert "GB of disk left" in too_big.json()["error"]["fields"]["size_gb"][0]
    made = client.post("/api/v1/volumes/", {**body, "size_gb": 1}, format="json")
    assert made.status_code == 201, made.content
    volume = Volume.objects.get(pk=made.json()["id"])
    rest = client.post(
        "/api/v1/volumes/", {**body, "name": "rest", "size_gb": machine.disk_free_gb},
        format="json",
    )  # fmt: skip
    assert rest.status_code == 400 and not Volume.objects.filter(name="rest").exists()
    grow = client.patch(f"/api/v1/volumes/{volume.pk}/", {"size_gb": machine.disk_free_gb + 1},
                        format="json")  # fmt: skip
    assert grow.status_code == 400

    Volume.objects.filter(pk=volume.pk).update(ends_at=timezone.now() - timedelta(minutes=1))
    refused = client.post(
        "/api/v1/instances/",
        {"machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
         "duration_hours": 1, "volumes": [{"volume": volume.pk, "target": "/data"}]},
        format="json",
    )  # fmt: skip
    assert refused.status_code == 400 and "period ended" in str(refused.json()["error"])
    expiry_sweep()  # within the grace period: kept
    assert Volume.objects.get(pk=volume.pk).state == VolumeState.READY
    Volume.objects.filter(pk=volume.pk).update(ends_at=timezone.now() - timedelta(hours=49))
    expiry_sweep()
    volume.refresh_from_db()
    assert volume.state == VolumeState.DELETED and volume.settled_at is not None
    assert Hold.objects.get(pk=volume.hold_id).status == "released"
    assert not os.path.exists(os.path.join(VOLUME_DIR, f"{volume.docker_name}.img"))


def test_a_volume_lost_from_the_host_is_mounted_again_before_its_container_starts(
    funded_team, owner, machine
):
    """After a host reboot the loop mount is gone: starting the rental mounts the image again,
    so the container sees the volume's data (not an empty, unlimited directory)."""
    client = key_client(funded_team)
    made = client.post(
        "/api/v1/volumes/",
        {"machine_id": machine.pk, "name": "keep", "size_gb": 1, "duration_hours": 24},
        format="json",
    ).json()
    volume = Volume.objects.get(pk=made["id"])
    instance = rented(client, machine, volumes=[{"volume": volume.pk, "target": "/data"}])
    assert run(client, instance, "echo kept > /data/mark; sync")["exit_code"] == 0
    assert client.post(f"/api/v1/instances/{instance.pk}/stop/").status_code == 202
    mount = os.path.join(VOLUME_DIR, volume.docker_name)
    subprocess.run(["umount", mount], check=True)  # as a reboot leaves it
    assert not os.path.ismount(mount)
    started = client.post(f"/api/v1/instances/{instance.pk}/start/")
    assert started.status_code == 200, started.content
    assert os.path.ismount(mount)
    assert run(client, instance, "cat /data/mark")["output"].strip() == "kept"


def test_a_volume_is_not_charged_while_its_machine_is_offline_and_deleting_it_then_waits_for_it(
    funded_team, sim_host_factory, provider_team, settings
):
    """The machine goes down for real: the volume's clock stops (charges freeze), deleting it
    settles at once (nothing charged from then) though the host cannot be reached, and the
    volume is removed on the host when the machine is back."""
    from hosts import services as host_services
    from marketplace.tasks import metering_sweep

    settings.HOST_HEARTBEAT_MISSES = 1
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    client = key_client(funded_team)
    made = client.post(
        "/api/v1/volumes/",
        {"machine_id": machine.pk, "name": "away", "size_gb": 1, "duration_hours": 24},
        format="json",
    )
    assert made.status_code == 201, made.content
    volume = Volume.objects.get(pk=made.json()["id"])
    on_host = os.path.join(VOLUME_DIR, volume.docker_name)
    assert os.path.ismount(on_host)
    host.stop()
    try:
        host_services.machine_heartbeat(machine_id=machine.pk)
        volume.refresh_from_db()
        assert volume.clock_since is None  # stopped with the machine
        frozen = volume.gb_seconds_at(timezone.now() + timedelta(hours=5))
        assert frozen == volume.gb_seconds_at(timezone.now())
        metering_sweep()
        captured = Hold.objects.get(pk=volume.hold_id).captured_storage
        assert captured == storage_owed(
            price_per_gb_month=STORAGE_PER_GB_MONTH, disk_gb=1, seconds=volume.gb_seconds
        )

        deleted = client.delete(f"/api/v1/volumes/{volume.pk}/")
        assert deleted.status_code == 204, deleted.content
        volume.refresh_from_db()
        assert volume.state == VolumeState.REMOVING and volume.settled_at is not None
        hold = Hold.objects.get(pk=volume.hold_id)
        assert hold.status == "released" and hold.captured_storage == captured
        shown = client.get(f"/api/v1/volumes/{volume.pk}/").json()
        assert shown["state"] == "removing"
        assert os.path.exists(on_host + ".img")  # the host could not be told yet
        assert client.delete(f"/api/v1/volumes/{volume.pk}/").status_code == 204  # no-op
    finally:
        host.start()
    host_services.machine_heartbeat(machine_id=machine.pk)  # online: the removal runs
    volume.refresh_from_db()
    assert volume.state == VolumeState.DELETED and volume.clock_since is None
    assert not os.path.exists(on_host) and not os.path.exists(on_host + ".img")
    assert client.get(f"/api/v1/volumes/{volume.pk}/").status_code == 404
    assert Hold.objects.get(pk=volume.hold_id).captured_storage == captured


def test_volume_clocks_put_in_step_by_the_sweep_when_a_status_event_was_lost(funded_team, machine):
    from marketplace.rentals.volume_metering import volumes_resync

    made = key_client(funded_team).post(
        "/api/v1/volumes/",
        {"machine_id": machine.pk, "name": "step", "size_gb": 1, "duration_hours": 24},
        format="json",
    )
    volume = Volume.objects.get(pk=made.json()["id"])
    type(machine).objects.filter(pk=machine.pk).update(status="offline")  # no event
    assert volumes_resync() == 1 and volumes_resync() == 0
    volume.refresh_from_db()
    assert volume.clock_since is None
    type(machine).objects.filter(pk=machine.pk).update(status="online")
    assert volumes_resync() == 1
    volume.refresh_from_db()
    assert volume.clock_since is not None


def test_a_volumes_period_is_extended_and_its_hold_grows(team, owner, machine):
    """API and console: the hold grows by the size × the price × the hours; credit short is
    402 with nothing written; a period already over starts again from now."""
    fund(team, dollars=1)
    client = key_client(team)
    made = client.post(
        "/api/v1/volumes/",
        {"machine_id": machine.pk, "name": "longer", "size_gb": 1, "duration_hours": 1},
        format="json",
    )
    assert made.status_code == 201, made.content
    volume = Volume.objects.get(pk=made.json()["id"])
    hold = Hold.objects.get(pk=volume.hold_id)
    base = f"/api/v1/volumes/{volume.pk}/extend/"

    for bad in ({"hours": 0}, {"hours": "soon"}, {}):
        refused = client.post(base, bad, format="json")
        assert refused.status_code == 400 and "hours" in refused.json()["error"]["fields"]
    short = client.post(base, {"hours": 24 * 365}, format="json")  # $1.20 of storage
    assert short.status_code == 402, short.content
    assert Volume.objects.get(pk=volume.pk).ends_at == volume.ends_at
    assert Hold.objects.get(pk=hold.pk).amount == hold.amount

    extended = client.post(base, {"hours": 24}, format="json")
    assert extended.status_code == 200, extended.content
    day = storage_owed(price_per_gb_month=STORAGE_PER_GB_MONTH, disk_gb=1, seconds=24 * 3600)
    assert Hold.objects.get(pk=hold.pk).amount == hold.amount + day
    assert Volume.objects.get(pk=volume.pk).ends_at == volume.ends_at + timedelta(hours=24)

    console = client_for(Client(), owner, team)
    page = console.post("/volumes/", {"action": "extend", "volume": volume.pk, "days": 1})
    assert page.status_code == 302
    assert Volume.objects.get(pk=volume.pk).ends_at == volume.ends_at + timedelta(hours=48)

    # Over: extending starts a new period from now; the time since its end is not charged.
    ended_at = timezone.now() - timedelta(hours=3)
    Volume.objects.filter(pk=volume.pk).update(ends_at=ended_at)
    used = Volume.objects.get(pk=volume.pk).gb_seconds_at(timezone.now())
    again = client.post(base, {"hours": 2}, format="json")
    assert again.status_code == 200, again.content
    volume.refresh_from_db()
    assert volume.gb_seconds == used and volume.ends_at > timezone.now() + timedelta(hours=1)
    assert volume.gb_seconds_at(timezone.now()) - used < 60  # seconds, not hours


def test_a_volumes_host_work_runs_after_its_transaction_and_is_recorded(
    funded_team, sim_host_factory, provider_team
):
    """The host is silent (its sshd down, the machine still online): creating answers at once
    with a volume being made and not charged, and the sweep makes it once the host is back; a
    resize fails cleanly (503, nothing recorded) and one a dead worker left half done is
    finished by the sweep; a volume its host never made fails and its hold goes back."""
    from marketplace.tasks import expiry_sweep

    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    client = key_client(funded_team)
    body = {"machine_id": machine.pk, "size_gb": 1, "duration_hours": 24}
    host.stop()
    try:
        made = client.post("/api/v1/volumes/", {**body, "name": "later"}, format="json")
        assert made.status_code == 201, made.content
        assert made.json()["state"] == "creating"
        volume = Volume.objects.get(pk=made.json()["id"])
        assert volume.clock_since is None and Hold.objects.get(pk=volume.hold_id).status == "open"
        refused = client.post(
            "/api/v1/instances/",
            {"machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
             "duration_hours": 1, "volumes": [{"volume": volume.pk, "target": "/data"}]},
            format="json",
        )  # fmt: skip
        assert refused.status_code == 400  # not mountable until it is made
        never = client.post("/api/v1/volumes/", {**body, "name": "never"}, format="json")
        lost = Volume.objects.get(pk=never.json()["id"])
        Volume.objects.filter(pk=lost.pk).update(created_at=timezone.now() - timedelta(hours=1))
        expiry_sweep()  # the host still silent: "later" waits, "never" has waited too long
        assert Volume.objects.get(pk=volume.pk).state == VolumeState.CREATING
        lost.refresh_from_db()
        assert lost.state == VolumeState.FAILED and "did not answer" in lost.failure
        assert Hold.objects.get(pk=lost.hold_id).status == "released"
        assert client.delete(f"/api/v1/volumes/{lost.pk}/").status_code == 204
        assert Volume.objects.get(pk=lost.pk).state == VolumeState.REMOVING  # host silent
    finally:
        host.start()
    expiry_sweep()
    assert Volume.objects.get(pk=lost.pk).state == VolumeState.DELETED
    volume.refresh_from_db()
    on_host = os.path.join(VOLUME_DIR, volume.docker_name)
    assert volume.state == VolumeState.READY and volume.clock_since is not None
    assert os.path.ismount(on_host)

    host.stop()
    try:
        silent = client.patch(f"/api/v1/volumes/{volume.pk}/", {"size_gb": 2}, format="json")
        assert silent.status_code == 503, silent.content
    finally:
        host.start()
    volume.refresh_from_db()
    assert (volume.size_gb, volume.resizing_to, volume.versions.count()) == (1, None, 1)

    Volume.objects.filter(pk=volume.pk).update(resizing_to=2)  # a worker died mid-resize
    busy = client.patch(f"/api/v1/volumes/{volume.pk}/", {"size_gb": 3}, format="json")
    assert busy.status_code == 400 and "under way" in str(busy.json()["error"])
    expiry_sweep()
    volume.refresh_from_db()
    assert (volume.size_gb, volume.resizing_to, volume.versions.count()) == (2, None, 2)
    assert os.path.getsize(on_host + ".img") == 2 * 1024**3


def test_a_clone_whose_source_is_deleted_first_fails_and_leaves_nothing(funded_team, machine):
    """The source is deleted in the clone's own transaction, before its host copies it: the
    clone fails with the reason, its hold goes back, and its image is gone from the host."""
    from django.db import transaction

    from marketplace.rentals.volumes import volume_clone, volume_create, volume_delete

    source = volume_create(
        team=funded_team, user=None, machine_id=machine.pk, name="src", size_gb=1, hours=2
    )
    source.refresh_from_db()
    assert source.state == VolumeState.READY
    with transaction.atomic():
        clone = volume_clone(source=source, user=None, name="copy", size_gb=None, hours=2)
        volume_delete(volume=Volume.objects.get(pk=source.pk))
    clone.refresh_from_db()
    assert clone.state == VolumeState.FAILED and "deleted before it was copied" in clone.failure
    assert clone.size_gb == 1 and clone.cloned_from_id == source.pk
    assert Hold.objects.get(pk=clone.hold_id).status == "released"
    assert not os.path.exists(os.path.join(VOLUME_DIR, f"{clone.docker_name}.img"))
