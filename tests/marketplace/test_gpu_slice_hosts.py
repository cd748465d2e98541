"""Fractional GPUs on real simulated hosts: the probe finds MPS, the provider turns sharing on,
a slice runs pinned to its card with its MPS limits, and racing renters get one slice each.

The hosts are real sshd + Docker; only the GPU tools are stand-ins (``nvidia-smi`` and
``nvidia-cuda-mps-control`` scripts that log how they were called).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from billing.models import Hold
from hosts import services as hosts
from hosts.models import Machine
from hosts.runtime.mps import CONTAINER_PIPE_DIRECTORY, MPS_PIPE_DIRECTORY
from marketplace.models import Rental
from marketplace.rentals.renting import rental_create
from scheduler.models import GpuSlice, Instance, InstanceState
from scheduler.services import NoCapacity
from tests.billing.ledger_checks import assert_ledger_consistent
from tests.billing.test_concurrency import race
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import docker_inspect, fund, machine_for
from tests.marketplace.test_gpu_slices import slice_order

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def provider_with_owner():
    from marketplace.models import Role

    team = TeamFactory()
    add_member(team, UserFactory(), Role.OWNER)
    return team


def test_sharing_needs_mps_which_the_probe_finds(sim_host_factory):
    with_mps, without = sim_host_factory(gpus=1), sim_host_factory(gpus=1, mps=False)
    provider = provider_with_owner()
    client = key_client(provider)
    machines = [machine_for(host, provider) for host in (with_mps, without)]
    for machine in machines:
        hosts.machine_probe(machine_id=machine.pk)
    found = dict(Machine.objects.filter(team=provider).values_list("pk", "mps_available"))
    assert found == {machines[0].pk: True, machines[1].pk: False}

    refused = client.put(
        f"/api/v1/machines/{machines[1].pk}/sharing/", {"enabled": True}, format="json"
    )
    assert refused.status_code == 400
    assert "no CUDA MPS" in refused.json()["error"]["fields"]["enabled"][0]
    assert not Machine.objects.get(pk=machines[1].pk).sharing_enabled

    bad = client.put(
        f"/api/v1/machines/{machines[0].pk}/sharing/",
        {"enabled": True, "min_core_percent": 0},
        format="json",
    )
    assert bad.status_code == 400 and "min_core_percent" in bad.json()["error"]["fields"]
    on = client.put(
        f"/api/v1/machines/{machines[0].pk}/sharing/",
        {"enabled": True, "min_core_percent": 20},
        format="json",
    )
    assert on.status_code == 200, on.content
    assert on.json()["sharing_enabled"] and on.json()["sharing_min_core_percent"] == 20
    # The worker started the MPS control daemon on the host, with the platform's directories.
    calls = (with_mps.root / "mps" / "calls").read_text().splitlines()
    assert f"-d pipe={MPS_PIPE_DIRECTORY} log=/run/gpumkt-mps/log" in calls
    offer = client.get(f"/api/v1/offers/?q=sharing=true machine_id={machines[0].pk}").json()
    [listed] = offer["offers"]
    assert listed["gpu_frac"] == 1.0 and listed["min_slice_core_percent"] == 20


def test_a_slice_runs_pinned_to_its_card_with_mps_limits_no_renter_can_change(
    sim_host_factory, provider_team, funded_team
):
    host = sim_host_factory(gpus=2)
    machine = machine_for(host, provider_team, mps_available=True, sharing_enabled=True)
    client = key_client(funded_team)
    order = {
        "machine_id": machine.pk,
        "gpu_share": {"core_percent": 25, "memory_mb": 8192},
        "image": "gpumkt/busybox:latest",
        "duration_hours": 1,
        "disk_gb": 2,
        "entrypoint": "sleep",
        "args": ["600"],
        "env": {"KEEP": "me"},
    }
    # The MPS limits are the platform's: a renter's own value is refused by name.
    for name in ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "cuda_mps_pinned_device_mem_limit"):
        refused = client.post("/api/v1/instances/", {**order, "env": {name: "100"}}, format="json")
        assert refused.status_code == 400
        assert "GPU slice" in refused.json()["error"]["fields"]["env"][0]
    assert not Instance.objects.filter(team=funded_team).exists()
    response = client.post("/api/v1/instances/", order, format="json")
    assert response.status_code == 201, response.content
    body = client.get(f"/api/v1/instances/{response.json()['id']}/").json()
    assert body["state"] == "running", body["status_message"]
    assert body["gpu_share"] == {"core_percent": 25, "memory_mb": 8192}
    # 8192 of 24564 MB is a third of the card, more than 25 % of its compute: priced so, at
    # $0.50 × 8192 / 24564 = $0.1667485 an hour, rounded once to the micro-dollar.
    assert body["dph_total"] == "0.166748"
    slice_ = GpuSlice.objects.get(instance_id=body["id"], released_at=None)
    assert body["gpus"] == [slice_.gpu.uuid]

    container = docker_inspect(Instance.objects.get(pk=body["id"]).container_id)
    env = set(container["Config"]["Env"])
    assert {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M",
        f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIRECTORY}",
        f"NVIDIA_VISIBLE_DEVICES={slice_.gpu.uuid}",
        "KEEP=me",
    } <= env
    [mount] = [m for m in container["Mounts"] if m["Type"] == "bind"]
    assert (mount["Source"], mount["Destination"], mount["RW"]) == (
        MPS_PIPE_DIRECTORY,
        CONTAINER_PIPE_DIRECTORY,
        False,
    )
    # The provider sees the card sliced, the slice by its size only (another team's rental).
    usage = key_client(provider_team).get(f"/api/v1/machines/{machine.pk}/gpus/").json()
    card = next(g for g in usage["gpus"] if g["uuid"] == slice_.gpu.uuid)
    assert card["state"] == "sliced" and usage["sliced"] == 1
    assert card["slices"] == [{"instance_id": None, "core_percent": 25, "memory_mb": 8192}]
    # A slice's GPU count is not a version's to change.
    more = client.patch(f"/api/v1/instances/{body['id']}/", {"num_gpus": 2}, format="json")
    assert more.status_code == 400 and "slice" in more.json()["error"]["fields"]["num_gpus"][0]
    # The same fraction of one unit's memory.
    fraction = Fraction(8192, 24564)
    assert container["HostConfig"]["Memory"] == int(machine.unit_memory_mb * fraction) << 20

    # Stop gives the slice back; start takes the same share of the same card again.
    assert client.post(f"/api/v1/instances/{body['id']}/stop/").status_code == 202
    assert not GpuSlice.objects.filter(instance_id=body["id"], released_at=None).exists()
    started = client.post(f"/api/v1/instances/{body['id']}/start/")
    assert started.status_code == 200, started.content
    again = GpuSlice.objects.get(instance_id=body["id"], released_at=None)
    assert (again.gpu_id, again.core_percent, again.memory_mb) == (slice_.gpu_id, 25, 8192)
    assert client.delete(f"/api/v1/instances/{body['id']}/").status_code == 202
    assert not GpuSlice.objects.filter(instance_id=body["id"], released_at=None).exists()
    assert_ledger_consistent()


def test_twenty_renters_race_for_the_last_quarter_of_a_card(sim_host, provider_team):
    machine = machine_for(sim_host, provider_team, mps_available=True, sharing_enabled=True)
    # One card, and a port where nothing answers: launches wait for the host, so the race is
    # the renting transaction's alone.
    machine.gpus.filter(index__gte=1).delete()
    Machine.objects.filter(pk=machine.pk).update(port=9)
    first = TeamFactory()
    fund(first, 50)
    for _ in range(3):
        rental_create(team=first, request=slice_order(machine, 25, 4000))
    racers = [TeamFactory() for _ in range(20)]
    for team in racers:
        fund(team, 5)
    results = race(
        [
            lambda t=t: rental_create(team=t, request=slice_order(machine, 25, 4000)).rental
            for t in racers
        ]
    )
    won = [r for r in results if isinstance(r, Rental)]
    assert len(won) == 1, results
    assert all(isinstance(r, NoCapacity) for r in results if r not in won)
    live = GpuSlice.objects.filter(gpu__machine=machine, released_at=None)
    assert live.count() == 4 and sum(s.core_percent for s in live) == 100
    # Nothing half-written for the nineteen: one instance, rental and hold each for the four.
    assert Instance.objects.filter(machine=machine).count() == 4
    assert Rental.objects.filter(machine=machine).count() == 4
    assert Hold.objects.filter(team__in=racers).count() == 1
    states = set(Instance.objects.filter(machine=machine).values_list("state", flat=True))
    assert states == {InstanceState.LAUNCHING}
    assert_ledger_consistent()


def test_launch_of_a_slice_starts_the_mps_daemon_the_host_lost(
    sim_host_factory, provider_team, funded_team
):
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team, mps_available=True, sharing_enabled=True)
    (host.root / "mps" / "daemon").unlink(missing_ok=True)  # as after a reboot
    rental = rental_create(team=funded_team, request=slice_order(machine, 50, 1000)).rental
    # The launch ran when the rental committed (tasks run eagerly here).
    assert Instance.objects.get(pk=rental.instance_id).state in (
        InstanceState.RUNNING,
        InstanceState.EXITED,
    )
    assert (host.root / "mps" / "daemon").exists()
