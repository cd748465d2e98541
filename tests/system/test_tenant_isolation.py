"""Tenants on one machine do not share a network: two teams rent on one simulated host (real
sshd, real Docker); B's container cannot open a TCP connection to A's container, while A's
published port still answers from outside, as the renter's connection line says. Nor does a
rental reach the host's own services, a link-local address (a cloud's metadata service) or
raw sockets once the host is set up (probed): the firewall is real iptables on this machine,
whose rules match only the platform's bridges."""

# ruff: noqa: F811 - the rental fixtures are imported from tests.marketplace.conftest
from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from hosts.models import Machine
from hosts.runtime import TENANT_NETWORK, ContainerSpec, DockerHost
from hosts.runtime.firewall import (
    BRIDGE_NAME_OPTION,
    COMMENT,
    firewall_ensure,
    is_platform_bridge,
)
from hosts.services import machine_probe
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
        mode = docker_inspect(instance.container_id)["HostConfig"]["NetworkMode"]
        assert mode not in ("default", "bridge", "host")  # the tenants' network, by its id


def label() -> dict[str, str]:
    key, value = sim_container_label().split("=", 1)
    return {key: value}


def test_containers_of_one_group_share_a_network_of_their_own(sim_host_factory, provider_team):
    """What a deployment's containers will use: a network of their own where they reach each
    other, behind the host's tenant firewall too; removed once its last container is gone, and
    made again on demand (idempotent)."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    host = DockerHost(machine)
    firewall_ensure(machine)
    assert our_rules()
    group = f"gpumkt-group-t{machine.pk}-{int(time.time() * 1000) % 10**9}"
    host.network_ensure(group)
    host.network_ensure(group)  # a redelivered launch: nothing to do
    bridge = subprocess.run(
        ["docker", "network", "inspect", "--format", "{{json .Options}}", group],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert '"com.docker.network.bridge.name":"gpumkt-br' in bridge  # the firewall matches it

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


def test_a_network_made_again_behind_the_platforms_back_is_checked_before_a_container_joins(
    sim_host_factory, provider_team
):
    """A launch names the network it checked by its id, so one re-made by hand under the same
    name (here outside the tenant firewall) is not joined on trust: the run is refused, the
    network checked, made again inside the firewall, and the container joins that one."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    host = DockerHost(machine)
    group = f"gpumkt-remade-t{machine.pk}-{int(time.time() * 1000) % 10**9}"

    def spec(suffix: str) -> ContainerSpec:
        return ContainerSpec(
            name=f"gpumkt-t-{machine.pk}-{suffix}", image=IMAGE, cpus=0.5, memory_mb=64,
            shm_mb=8, labels=label(), network=group, entrypoint="sleep", args=["600"],
        )  # fmt: skip

    host.remove(host.run(spec("remade-1")))
    subprocess.run(["docker", "network", "rm", group], check=True, capture_output=True)
    subprocess.run(["docker", "network", "create", group], check=True, capture_output=True)
    second = host.run(spec("remade-2"))
    try:
        joined = docker_inspect(second)["NetworkSettings"]["Networks"][group]["NetworkID"]
        bridge = subprocess.run(
            ["docker", "network", "inspect", "--format",
             f'{{{{index .Options "{BRIDGE_NAME_OPTION}"}}}}', joined],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        assert is_platform_bridge(bridge), bridge
    finally:
        host.remove(second)
        assert host.network_remove(group) is True


# --- The host's firewall -------------------------------------------------------------------


def exec_in(team, instance, command: str) -> str:
    response = key_client(team).post(
        f"/api/v1/instances/{instance.pk}/exec/", {"command": command}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()["output"]


def reach(team, instance, address: str, port: int) -> str:
    """What a connection from inside the rental to address:port reads, and nc's exit status."""
    return exec_in(team, instance, f"nc -w 3 {address} {port} </dev/null; echo exit=$?")


@pytest.fixture
def host_listener():
    """A TCP server of the host itself, on every address, greeting each connection."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello-from-the-host\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


NEIGHBOUR_SERVER = (
    "import socket\n"
    "s = socket.create_server(('0.0.0.0', 80))\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(b'hello-from-the-neighbour\\n'); c.close()\n"
)


@dataclass(frozen=True)
class Neighbour:
    """A machine beside the host, reached through it: its address, the host's address on the
    link between them, and a way to run a command on it."""

    address: str
    host_side: str
    namespace: str

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", self.namespace, *argv], capture_output=True, text=True
        )


@contextmanager
def neighbour(prefix: str, tag: str):
    """A server at ``prefix`` + 2 (a /30 of which the host holds ``prefix`` + 1) in a network
    namespace of its own on a veth pair: forwarded through the host as a cloud's metadata
    service or a machine on the provider's LAN is, while nothing of this machine's own routing
    changes beyond that /30. All is removed after."""
    n = int(os.environ.get("TEST_NAMESPACE", "0")) % 60
    name, outer, inner = f"gpumkt-{tag}{n}", f"gp{tag}{n}h", f"gp{tag}{n}n"
    host_side, address = f"{prefix}{4 * n + 1}", f"{prefix}{4 * n + 2}"

    def ip(*args: str, check: bool = True) -> None:
        subprocess.run(["ip", *args], check=check, capture_output=True)

    ip("netns", "del", name, check=False)  # left by a killed run
    ip("netns", "add", name)
    server = None
    try:
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", name)
        ip("addr", "add", f"{host_side}/30", "dev", outer)
        ip("link", "set", outer, "up")
        ip("-n", name, "addr", "add", f"{address}/30", "dev", inner)
        ip("-n", name, "link", "set", inner, "up")
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "route", "add", "default", "via", host_side)
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", NEIGHBOUR_SERVER]
        )
        # The host itself reaches it: the server is up and routed.
        assert greeting_from(address, 80) == "hello-from-the-neighbour\n"
        yield Neighbour(address, host_side, name)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        ip("netns", "del", name, check=False)  # takes the veth pair with it


@pytest.fixture
def link_local_listener():
    """A stand-in for a cloud's metadata service at a 169.254 address (not 169.254.169.254
    itself, which this machine's own cloud may answer)."""
    with neighbour("169.254.213.", "ll") as server:
        yield server.address


def host_address_outside() -> str | None:
    """This machine's own address on its default route (its LAN or public address)."""
    route = subprocess.run(
        ["ip", "-4", "route", "get", "1.1.1.1"], capture_output=True, text=True
    ).stdout.split()
    return route[route.index("src") + 1] if "src" in route else None


def our_rules() -> list[str]:
    listed = subprocess.run(
        ["sh", "-c", "iptables -w -S DOCKER-USER; iptables -w -S INPUT"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [line for line in listed.splitlines() if COMMENT in line]


def test_a_rental_reaches_neither_the_host_nor_link_local_addresses_nor_raw_sockets(
    sim_host_factory, provider_team, host_listener, link_local_listener
):
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    DockerHost(machine).network_ensure(TENANT_NETWORK)  # one made before the firewall: again
    machine = machine_probe(machine_id=machine.pk)  # the host's setup, as when it is added
    assert machine.tenant_firewall is True, machine.tenant_firewall_detail
    rules = our_rules()
    assert machine_probe(machine_id=machine.pk).tenant_firewall is True
    assert our_rules() == rules  # set up again: nothing added, nothing moved

    team = renter("Team C")
    c = rent(team, machine, ["-c", SERVE], ports=[8080])
    gateway = docker_inspect(c.container_id)["NetworkSettings"]["Networks"][TENANT_NETWORK][
        "Gateway"
    ]
    # The host's own services: not through the bridge's gateway, nor its other address.
    assert greeting_from("127.0.0.1", host_listener) == "hello-from-the-host\n"
    for address in filter(None, [gateway, host_address_outside()]):
        said = reach(team, c, address, host_listener)
        assert "hello-from-the-host" not in said and "exit=0" not in said, (address, said)
    # Link-local addresses (a cloud's metadata service), which the host itself reaches.
    for address in (link_local_listener, "169.254.169.254"):
        said = reach(team, c, address, 80)
        assert "hello-from" not in said and "exit=0" not in said, (address, said)
    # No raw sockets and no ping sockets: ping fails even on the container's own loopback.
    pinged = exec_in(team, c, "ping -c 1 -W 2 127.0.0.1; echo exit=$?")
    assert "exit=0" not in pinged and "1 packets received" not in pinged, pinged
    status = exec_in(team, c, "cat /proc/1/status")
    bounding = int(next(ln for ln in status.splitlines() if ln.startswith("CapBnd")).split()[1], 16)
    net_raw, setuid = 1 << 13, 1 << 7
    assert not bounding & net_raw and bounding & setuid
    # No swap beyond the memory limit.
    config = docker_inspect(c.container_id)["HostConfig"]
    assert config["Memory"] > 0 and config["MemorySwap"] == config["Memory"]
    assert config["CapDrop"] == ["ALL"] and "NET_RAW" not in config["CapAdd"]
    # Its published port still answers from outside, and the container's network works.
    published = PortAllocation.objects.get(instance=c, released_at=None).host_port
    assert greeting_from(machine.address, published) == "hello-from-a\n"
    c_ip = address_on(c.container_id, TENANT_NETWORK)
    assert "hello-from-a" in exec_in(team, c, f"nc -w 3 {c_ip} 8080 </dev/null")


def test_a_host_whose_firewall_cannot_be_set_up_is_flagged(sim_host_factory, provider_team):
    """A host where iptables refuses the platform's SSH user (not root, say): the probe still
    succeeds, and the machine says its rentals are not fenced, and why."""
    sim_host = sim_host_factory(gpus=1)
    refusing = sim_host.root / "bin" / "iptables"
    refusing.write_text(
        "#!/bin/sh\necho 'iptables v1.8.9 (nf_tables): Permission denied (you must be root)' >&2\n"
        "exit 4\n"
    )
    refusing.chmod(0o755)
    machine = machine_for(sim_host, provider_team)
    machine = machine_probe(machine_id=machine.pk)
    assert machine.status == "online"
    assert machine.tenant_firewall is False
    assert "you must be root" in machine.tenant_firewall_detail
    assert machine.events.filter(kind="tenant_firewall_missing").count() == 1
    machine_probe(machine_id=machine.pk)  # the same finding again: no second event
    assert machine.events.filter(kind="tenant_firewall_missing").count() == 1
    refusing.unlink()  # the provider fixes it and probes again
    assert machine_probe(machine_id=machine.pk).tenant_firewall is True


CLIENT = (
    "import socket, sys\n"
    "c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
    "print(c.recv(100).decode(), end='')\n"
)


def test_a_range_the_provider_names_is_refused_yet_its_clients_reach_published_ports(
    sim_host_factory, provider_team
):
    """A machine on the provider's LAN, in a range the provider names: a rental cannot open a
    connection to it, while a client there still gets the rental's published port (its
    replies pass before any refusal)."""
    n = int(os.environ.get("TEST_NAMESPACE", "0")) % 60
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    with neighbour(f"10.254.{n}.", "lan") as lan:
        machine.blocked_ranges = [f"10.254.{n}.0/24"]
        machine.save(update_fields=["blocked_ranges"])
        DockerHost(machine).network_ensure(TENANT_NETWORK)
        try:
            machine = machine_probe(machine_id=machine.pk)
            assert machine.tenant_firewall is True, machine.tenant_firewall_detail
            assert f"10.254.{n}.0/24" in machine.tenant_firewall_detail
            team = renter("Team D")
            d = rent(team, machine, ["-c", SERVE], ports=[8080])
            said = reach(team, d, lan.address, 80)
            assert "hello-from" not in said and "exit=0" not in said, said
            published = PortAllocation.objects.get(instance=d, released_at=None).host_port
            deadline = time.monotonic() + 20
            while True:  # nc serves one connection at a time
                answered = lan.run(sys.executable, "-c", CLIENT, lan.host_side, str(published))
                if answered.stdout or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert answered.stdout == "hello-from-a\n", answered.stderr
        finally:
            # The simulated hosts share this machine's chains: leave no range behind.
            Machine.objects.filter(pk=machine.pk).update(blocked_ranges=[])
            machine.refresh_from_db()
            assert firewall_ensure(machine).ok
            assert not [rule for rule in our_rules() if "10.254." in rule]


def bridge_of(network: str) -> str:
    return subprocess.run(
        ["docker", "network", "inspect", "--format",
         '{{index .Options "com.docker.network.bridge.name"}}', network],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def test_a_network_made_before_the_firewall_is_told_and_made_again_inside_it_once_unused(
    sim_host_factory, provider_team
):
    """A host set up before the firewall has platform networks on bridges the rules do not
    match: the probe says so; the platform keeps one a container uses (removing it would cut
    that rental off) and makes it again, on a covered bridge, once none does."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    host = DockerHost(machine)
    group = f"gpumkt-old-t{machine.pk}-{int(time.time() * 1000) % 10**9}"
    subprocess.run(
        ["docker", "network", "create", "--driver", "bridge", "--label", "gpumkt.platform=1", group],
        check=True, capture_output=True,
    )  # fmt: skip
    holder = subprocess.run(
        ["docker", "run", "--detach", "--label", sim_container_label(), "--network", group,
         "--label", f"gpumkt.machine={machine.pk}", IMAGE, "sleep", "600"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        state = firewall_ensure(machine)
        assert state.ok is False and group in state.detail
        assert host.network_ensure(group) is False  # in use: kept as it is
        assert not bridge_of(group).startswith("gpumkt-br")
        subprocess.run(["docker", "rm", "--force", holder], check=True, capture_output=True)
        assert host.network_ensure(group) is True  # unused now: made again, covered
        assert bridge_of(group).startswith("gpumkt-br")
        assert group not in firewall_ensure(machine).detail
    finally:
        subprocess.run(["docker", "rm", "--force", holder], capture_output=True)
        host.network_remove(group)


def test_setups_racing_on_one_host_add_each_rule_once(sim_host_factory, provider_team):
    """A probe and a self-test may set one host up at once: each rule is checked and inserted
    under a lock on the host, so none is added twice."""
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    for rule in our_rules():  # ours only, by their exact text; the setups below put them back
        chain_and_spec = shlex.split(rule)[1:]
        subprocess.run(["iptables", "-w", "-D", *chain_and_spec], check=True)
    with ThreadPoolExecutor(max_workers=6) as pool:
        states = list(pool.map(lambda _: firewall_ensure(machine), range(6)))
    rules = our_rules()
    assert len(rules) == len(set(rules)) == 5, rules  # replies, bridges, link-local; host x2
    assert all(state.detail for state in states)
