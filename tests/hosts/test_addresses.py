"""Machine addresses: the platform never connects to its own loopback, link-local metadata
services and the like, and its errors do not tell a closed port from a non-SSH one."""

from __future__ import annotations

import contextlib
import re
import socket
import threading

import pytest
from django.core.exceptions import ValidationError

from hosts import services
from hosts.models import Machine, MachineStatus
from tests.hosts.support import online_machine
from tests.ports import closed_port


def register(team, address: str, port: int = 22) -> Machine:
    return services.machine_register(
        team_id=team.pk, name="m", address=address, port=port, ssh_user="root"
    )


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.1", "2130706433", "0x7f000001", "localhost", "LocalHost.", "db.localhost",
        "::1", "[::1]", "::ffff:127.0.0.1", "169.254.169.254", "fe80::1", "0.0.0.0", "::",
        "224.0.0.1", "ff02::1", "240.0.0.1",
    ],
)  # fmt: skip
def test_production_refuses_addresses_of_the_platform_itself_naming_the_field(
    team, settings, address
):
    settings.HOST_ALLOW_LOOPBACK = False
    with pytest.raises(ValidationError) as caught:
        register(team, address)
    assert "The platform does not connect to" in caught.value.message_dict["address"][0]
    assert not Machine.objects.exists()


@pytest.mark.parametrize(
    "address", ["203.0.113.7", "10.1.2.3", "192.168.1.20", "100.64.0.9", "gpu1.example.com"]
)
def test_public_and_private_addresses_are_accepted(team, settings, address):
    settings.HOST_ALLOW_LOOPBACK = False
    assert register(team, address).address == address


def test_loopback_is_allowed_where_the_setting_allows_it(team, settings):
    settings.HOST_ALLOW_LOOPBACK = True
    assert register(team, "127.0.0.10", 2201).address == "127.0.0.10"
    with pytest.raises(ValidationError):  # link-local stays refused everywhere
        register(team, "169.254.169.254")


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_stored_address_that_reaches_loopback_is_refused_at_connect(team, sim_host, settings):
    machine = online_machine(team, sim_host)
    log = (sim_host.root / "sshd.log").read_text()
    settings.HOST_ALLOW_LOOPBACK = False  # production: the address reaches the platform itself
    Machine.objects.filter(pk=machine.pk).update(host_key="", status=MachineStatus.PENDING)
    machine = services.machine_fetch_host_key(machine_id=machine.pk)
    assert machine.status == MachineStatus.ERROR
    assert "does not connect to" in machine.status_detail and "loopback" in machine.status_detail
    assert (sim_host.root / "sshd.log").read_text() == log  # not even a connection


@contextlib.contextmanager
def http_server():
    """A port that answers like a web server, not an SSH server."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@pytest.mark.django_db(transaction=True)
def test_closed_and_non_ssh_ports_read_the_same_to_the_provider(team):
    with http_server() as web_port:
        web = services.machine_fetch_host_key(machine_id=register(team, "127.0.0.1", web_port).pk)
    with closed_port() as closed_at:
        closed = services.machine_fetch_host_key(
            machine_id=register(team, "127.0.0.1", closed_at).pk
        )
    assert web.status == closed.status == MachineStatus.ERROR
    assert re.sub(r":\d+", ":PORT", web.status_detail) == re.sub(
        r":\d+", ":PORT", closed.status_detail
    )
    assert "No SSH server answered" in web.status_detail


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("999.999.1.1", "not an IP address"),
        ("10.0.0.256", "not an IP address"),
        ("http://example.com:22", "without a scheme"),
        ("example.com/ssh", "without a scheme"),
        ("root@gpu1.example.com", "the SSH user goes in its own field"),
        ("gpu_1.example.com", "letters, digits, hyphens and dots"),
        ("-gpu.example.com", "A host name or IP address"),
        ("gpu..example.com", "letters, digits, hyphens and dots"),
        ("gpu1.example.com:ssh", "a port goes in the Port field"),
        ("2001:db8::zz", "a port goes in the Port field"),
    ],
)
def test_an_address_that_is_no_host_name_or_ip_is_refused_saying_why(team, address, reason):
    with pytest.raises(ValidationError) as caught:
        register(team, address)
    assert reason in caught.value.message_dict["address"][0]
    assert not Machine.objects.exists()


@pytest.mark.parametrize(
    ("typed", "address", "port"),
    [
        ("gpu1.example.com:2222", "gpu1.example.com", 2222),
        ("203.0.113.7:2200", "203.0.113.7", 2200),
        ("[2001:db8::1]:2201", "[2001:db8::1]", 2201),
        ("2001:db8::1", "2001:db8::1", 22),
        ("gpu-1.eu-west.example.net.", "gpu-1.eu-west.example.net.", 22),
    ],
)
def test_a_port_typed_with_the_address_is_taken_from_it(team, settings, typed, address, port):
    settings.HOST_ALLOW_LOOPBACK = False
    machine = register(team, typed)
    assert (machine.address, machine.port) == (address, port)
