"""A rental's disk is allocated at creation and enforced where the host's Docker can cap it:
the probe finds out, offers say so, and the container cannot write past its size."""

from __future__ import annotations

import time

import pytest

from hosts.probe import probe
from hosts.services import machine_apply_probe
from marketplace.models import Offer
from marketplace.services.offers import offer_refresh
from tests.conftest import key_client
from tests.marketplace.conftest import docker_inspect, machine_for
from tests.marketplace.test_rental_lifecycle import rented

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

# The fill runs in the background inside the container, read back by short execs: writing a
# gigabyte can pass one exec's 30 s limit when the engine's disk is busy, and what is checked
# is where the writes stopped, not how fast they went. Its log is on tmpfs: the disk is full.
FILL = (
    "(dd if=/dev/zero of=/fill bs=1M count=2048 > /dev/shm/fill.log 2>&1;"
    " echo size=$(wc -c < /fill) >> /dev/shm/fill.log) < /dev/null > /dev/null 2>&1 &"
)


def exec_in(client, instance, command: str) -> dict:
    answer = client.post(
        f"/api/v1/instances/{instance.pk}/exec/", {"command": command}, format="json"
    )
    assert answer.status_code == 200, answer.content
    return answer.json()


def fill_log_when_done(client, instance, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while "size=" not in (output := exec_in(client, instance, "cat /dev/shm/fill.log")["output"]):
        assert time.monotonic() < deadline, f"the fill did not stop in {timeout:g} s: {output}"
        time.sleep(0.5)
    return output


def test_a_host_with_storage_quotas_caps_the_rental_disk(
    funded_team, machine, sim_host_factory, provider_team
):
    enforced = machine_for(sim_host_factory(gpus=1, disk_enforced=True), provider_team)
    # The probe reads each host's Docker: btrfs here, overlay2 on ext4 on the shared engine.
    assert probe(enforced).disk_enforced is True
    assert probe(machine).disk_enforced is False
    enforced = machine_apply_probe(machine_id=enforced.pk, result=probe(enforced))
    assert enforced.disk_enforced
    offer_refresh(machine_id=enforced.pk)
    client = key_client(funded_team)

    found = client.get("/api/v1/offers/", {"q": "disk_enforced=true num_gpus>=1"}).json()
    ids = {offer["machine_id"]: offer["disk_enforced"] for offer in found["offers"]}
    assert ids.get(enforced.pk) is True and machine.pk not in ids
    assert Offer.objects.get(machine=machine, all_free=True).disk_enforced is False
    quote = client.get(
        f"/api/v1/offers/{machine.pk}/quote/", {"num_gpus": 1, "duration_hours": 1}
    ).json()
    assert quote["disk_enforced"] is False and "does not enforce" in quote["disk_note"]

    instance = rented(client, enforced, disk_gb=1)
    inspected = docker_inspect(instance.container_id, machine=enforced)
    assert inspected["HostConfig"]["StorageOpt"] == {"size": "1G"}
    assert client.get(f"/api/v1/instances/{instance.pk}/").json()["disk_enforced"] is True

    assert exec_in(client, instance, FILL)["exit_code"] == 0
    output = fill_log_when_done(client, instance)
    assert "quota exceeded" in output or "No space" in output, output
    written = int(output.rsplit("size=", 1)[1].split()[0])
    # Stopped at the 1 GB cap (filesystem metadata takes a little of it), far short of 2 GB.
    assert 0.9 * 1024**3 < written <= 1024**3
