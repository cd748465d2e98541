"""A machine's GPU and port usage, as its provider reads it, agrees with what Docker runs on
the host and with the allocations; another team's rentals show only as "rented"."""

from __future__ import annotations

import pytest
from django.test import Client

from scheduler.models import GpuAllocation, PortAllocation
from tests.conftest import client_for, key_client, sim_container_label
from tests.marketplace.conftest import docker, docker_inspect, fund, machine_for
from tests.marketplace.test_rental_lifecycle import rented

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_usage_endpoints_agree_with_docker_and_the_allocations(
    funded_team, sim_host_factory, provider_team
):
    machine = machine_for(sim_host_factory(gpus=4), provider_team)
    theirs = rented(key_client(funded_team), machine, num_gpus=2, ports=[8080, 9090])
    fund(provider_team)
    provider = key_client(provider_team)
    own = rented(provider, machine, num_gpus=1, ports=[7070])
    gpus = provider.get(f"/api/v1/machines/{machine.pk}/gpus/").json()
    ports = provider.get(f"/api/v1/machines/{machine.pk}/ports/").json()

    # What Docker runs on the host: each container's GPUs and published ports.
    by_name = {f"/{i.container_name}": i.pk for i in (own, theirs)}
    host_gpus, host_ports = {}, {}
    # (The label of this test run too: other runs on this machine have machines of this id.)
    running = docker(
        "ps", "-q", "--filter", f"label=gpumkt.machine={machine.pk}",
        "--filter", f"label={sim_container_label()}",
    ).stdout.split()  # fmt: skip
    assert len(running) == 2
    for container in running:
        inspected = docker_inspect(container)
        holder = by_name[inspected["Name"]]
        env = dict(item.split("=", 1) for item in inspected["Config"]["Env"])
        for uuid in env["NVIDIA_VISIBLE_DEVICES"].split(","):
            host_gpus[uuid] = holder
        for published, bindings in inspected["NetworkSettings"]["Ports"].items():
            for binding in bindings or []:
                host_ports[int(binding["HostPort"])] = (int(published.split("/")[0]), holder)

    rented_gpus = {g["uuid"]: g for g in gpus["gpus"] if g["state"] == "rented"}
    assert set(rented_gpus) == set(host_gpus)
    assert set(rented_gpus) == set(
        GpuAllocation.objects.filter(released_at=None, gpu__machine=machine).values_list(
            "gpu__uuid", flat=True
        )
    )
    assert (gpus["total"], gpus["rented"], gpus["free"]) == (4, 3, 1)
    for uuid, holder in host_gpus.items():
        # The provider's own rental is named; the other team's is only "rented".
        assert rented_gpus[uuid]["instance_id"] == (own.pk if holder == own.pk else None)
    assert all(g["utilization_percent"] == 0 for g in gpus["gpus"])  # read from nvidia-smi

    served = {p["host_port"]: (p["container_port"], p["instance_id"]) for p in ports["ports"]}
    assert served == {
        host: (container, holder if holder == own.pk else None)
        for host, (container, holder) in host_ports.items()
    }
    assert set(served) == set(
        PortAllocation.objects.filter(machine=machine, released_at=None).values_list(
            "host_port", flat=True
        )
    )
    assert (ports["used"], ports["free"]) == (3, ports["total"] - 3)

    owner = provider_team.memberships.get().user
    page = client_for(Client(), owner, provider_team).get(f"/machines/{machine.pk}/usage/")
    html = page.content.decode()
    assert page.status_code == 200 and f'href="/instances/{own.pk}/"' in html
    assert f'href="/instances/{theirs.pk}/"' not in html and "3 of 4 GPUs rented" in html
