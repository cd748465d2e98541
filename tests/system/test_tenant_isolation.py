"""Tenants on one machine do not share a network: two teams rent on one simulated host (real
sshd, real Docker); B's container cannot open a TCP connection to A's container, while A's
published port still answers from outside, as the renter's connection line says."""

# ruff: noqa: F811 - the rental fixtures are imported from tests.marketplace.conftest
from __future__ import annotations

import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from hosts.runtime import TENANT_NETWORK, ContainerSpec, DockerHost
from marketplace.models import Role
from scheduler.models import Instance, PortAllocation
from tests.conftest import key_client, sim_container_label
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import (  # noqa: F401 - fixtures used by name
    _label_test_containers,
    docker_inspect,
    fund,
    machine_for,
    provider_team,
)

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

IMAGE = "gpumkt/busybox:latest"
# Answers every TCP connection on 8080 with a greeting (busybox nc, one connection at a time).
SERVE = "while :; do echo hello-from-a | nc -l -p 8080; done"


def renter(name: str):
    team = TeamFactory(name=name)
    add_member(team, UserFactory(username=name.lower().replace(" ", "-")), Role.OWNER)
    fund(team)
    return team


def rent(team, machine, args: list[str], ports: list[int]) -> Instance:
    response = key_client(team).post(
        "/api/v1/instances/",
        {
            "machine_id": machine.pk, "num_gpus": 1, "image": IMAGE, "duration_hours": 1,
            "disk_gb": 5, "entrypoint": "sh", "args": args, "ports": ports,
        },
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == "running", instance.status_message
    return instance


def address_on(container_id: str, network: str) -> str:
    return docker_inspect(container_id)["NetworkSettings"]["Networks"][network]["IPAddress"]


def greeting_from(host: str, port: int, timeout: float = 20) -> str:
    """What the server at host:port says, tried until it listens (nc restarts per connection)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=3) as conn:
                conn.settimeout(3)
                said = conn.recv(100).decode()
                if said:
                    return said
        except OSError:
            pass
        if time.monotonic() > deadline:
            return ""
        time.sleep(0.2)


def test_one_tenant_cannot_reach_anothers_container_but_its_published_port_answers(
    sim_host_factory, provider_team
):
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    team_a, team_b = renter("Team A"), renter("Team B")
    a = rent(team_a, machine, ["-c", SERVE], ports=[8080])
    b = rent(team_b, machine, ["-c", "exec sleep 600"], ports=[])
    a_ip = address_on(a.container_id, TENANT_NETWORK)

    # A's published port answers from outside, at the address the renter is given.
    published = PortAllocation.objects.get(instance=a, released_at=None).host_port
    assert greeting_from(machine.address, published) == "hello-from-a\n"
    # A itself reaches its own server on its own address (its network works).
    own = (
        key_client(team_a)
        .post(
            f"/api/v1/instances/{a.pk}/exec/",
            {"command": f"nc -w 3 {a_ip} 8080 </dev/null"},
            format="json",
        )
        .json()
    )
    assert "hello-from-a" in own["output"], own

    # B, on the same machine, cannot open a connection to A's container (busybox nc exits
    # non-zero on a timeout or a refusal, and prints nothing from A).
    probe = (
        key_client(team_b)
        .post(
            f"/api/v1/instances/{b.pk}/exec/",
            {"command": f"nc -w 3 {a_ip} 8080 </dev/null; echo exit=$?"},
            format="json",
        )
        .json()
    )
    assert "hello-from-a" not in probe["output"], probe
    assert "exit=0" not in probe["output"], probe
    # Neither container is on Docker's default bridge, where containers reach each other.
    for instance in (a, b):
        networks = docker_inspect(instance.container_id)["NetworkSettings"]["Networks"]
        assert list(networks) == [TENANT_NETWORK]
        assert docker_inspect(instance.container_id)["HostConfig"]["NetworkMode"] == TENANT_NETWORK


def label() -> dict[str, str]:
    key, value = sim_container_label().split("=", 1)
    return {key: value}


def test_containers_of_one_group_share_a_network_of_their_own(sim_host_factory, provider_team):
    """What a deployment's containers will use: a network of their own where they reach each
    other; removed once its last container is gone, and made again on demand (idempotent)."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    host = DockerHost(machine)
    group = f"gpumkt-group-t{machine.pk}-{int(time.time() * 1000) % 10**9}"
    host.network_ensure(group)
    host.network_ensure(group)  # a redelivered launch: nothing to do

    def start(suffix: str, script: str) -> str:
        return host.run(
            ContainerSpec(
                name=f"gpumkt-t-{machine.pk}-{suffix}", image=IMAGE, cpus=0.5, memory_mb=64,
                shm_mb=8, labels=label(), network=group, entrypoint="sh", args=["-c", script],
            )
        )  # fmt: skip

    server = start("grp-server", SERVE)
    client = start("grp-client", "exec sleep 600")
    try:
        server_ip = address_on(server, group)
        deadline = time.monotonic() + 20
        while True:
            said = host.exec(client, ["sh", "-c", f"nc -w 3 {server_ip} 8080 </dev/null"])
            if "hello-from-a" in said.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "hello-from-a" in said.stdout
        assert host.network_remove(group) is False  # still in use: it stays
    finally:
        host.remove(server)
        host.remove(client)
    assert host.network_remove(group) is True
    assert host.network_remove(group) is True  # already gone: still fine


def test_launches_racing_on_one_host_make_one_network(sim_host_factory, provider_team):
    """Docker's duplicate-name check is not atomic (measured: six concurrent `docker network
    create` of one name made two networks, and `--network` by that name then fails); the
    platform's creates take turns on the host."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    group = f"gpumkt-race-t{machine.pk}-{int(time.time() * 1000) % 10**9}"
    hosts = [DockerHost(machine) for _ in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda host: host.network_ensure(group), hosts))
    try:
        listed = subprocess.run(
            ["docker", "network", "ls", "--quiet", "--filter", f"name=^{group}$"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert len(listed) == 1, listed
    finally:
        hosts[0].network_remove(group)


def test_a_network_removed_behind_the_platforms_back_is_made_again_at_the_next_run(
    sim_host_factory, provider_team
):
    """Launches trust a network they checked a moment ago instead of asking Docker again each
    time; when it was removed meanwhile (a provider's `docker network prune`), the run is
    refused before any container is made, and the platform makes it again and runs."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    host = DockerHost(machine)
    group = f"gpumkt-gone-t{machine.pk}-{int(time.time() * 1000) % 10**9}"

    def spec(suffix: str) -> ContainerSpec:
        return ContainerSpec(
            name=f"gpumkt-t-{machine.pk}-{suffix}", image=IMAGE, cpus=0.5, memory_mb=64,
            shm_mb=8, labels=label(), network=group, entrypoint="sleep", args=["600"],
        )  # fmt: skip

    first = host.run(spec("gone-1"))
    host.remove(first)
    subprocess.run(["docker", "network", "rm", group], check=True, capture_output=True)
    second = host.run(spec("gone-2"))
    try:
        assert docker_inspect(second)["State"]["Running"] is True
        assert group in docker_inspect(second)["NetworkSettings"]["Networks"]
    finally:
        host.remove(second)
        assert host.network_remove(group) is True
