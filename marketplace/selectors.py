"""Reads that take thought: how to connect to an instance, whether credit covers the rentals."""

from __future__ import annotations

from dataclasses import dataclass

from billing.money import format_usd
from core.db import release_database_connection
from scheduler.models import Instance, InstanceState, LaunchMode
from scheduler.services import JUPYTER_CONTAINER_PORT, LIVE_PORTS, SSH_CONTAINER_PORT


def published_ports(
    instance: Instance, ports: list[tuple[int, int, str]] | None = None
) -> list[dict[str, object]]:
    """The instance's live host ports, by container port: the one listing the console's
    Connect table, the API's ``connection.ports`` and the SSH and Jupyter lines all read.
    ``ports``: the (container port, host port, protocol) a rent just wrote, by container port,
    instead of reading them back."""
    host = instance.machine.address
    if ports is None and (live := getattr(instance, LIVE_PORTS, None)) is not None:
        ports = [(p.container_port, p.host_port, p.protocol) for p in live]
    if ports is None:
        ports = [
            (p.container_port, p.host_port, p.protocol)
            for p in instance.port_allocations.filter(released_at=None).order_by("container_port")
        ]
    return [
        {"container_port": container_port, "host_port": host_port, "protocol": protocol,
         "address": f"{host}:{host_port}"}
        for container_port, host_port, protocol in ports
    ]  # fmt: skip


def _host_port(ports: list[dict[str, object]], container_port: int) -> object | None:
    return next((p["host_port"] for p in ports if p["container_port"] == container_port), None)


def instance_ssh_address(instance: Instance) -> tuple[str, int] | None:
    """Where a running SSH-mode instance's sshd answers: its machine's address and the host
    port published for its port 22 (None otherwise)."""
    if instance.state != InstanceState.RUNNING or instance.launch_mode != LaunchMode.SSH:
        return None
    port = _host_port(published_ports(instance), SSH_CONTAINER_PORT)
    return None if port is None else (instance.machine.address, int(port))


def instance_connection(
    instance: Instance, ports: list[tuple[int, int, str]] | None = None
) -> dict[str, object]:
    """Ready-to-copy connection details: SSH line, Jupyter URL, published ports (``ports``:
    as ``published_ports`` takes them)."""
    host = instance.machine.address
    ports = published_ports(instance, ports)
    details: dict[str, object] = {"host": host, "ports": ports, "ssh": None, "jupyter": None}
    # Only a running instance gets a line to use: its launch checked that the image has the
    # mode's sshd or jupyter (a launching one may yet fail for want of it).
    if instance.state != InstanceState.RUNNING:
        return details
    ssh_port = _host_port(ports, SSH_CONTAINER_PORT)
    if instance.launch_mode == LaunchMode.SSH and ssh_port is not None:
        details["ssh"] = f"ssh -p {ssh_port} root@{host}"
    jupyter_port = _host_port(ports, JUPYTER_CONTAINER_PORT)
    if instance.launch_mode == LaunchMode.JUPYTER and jupyter_port is not None:
        details["jupyter"] = f"http://{host}:{jupyter_port}/lab?token={instance.jupyter_token}"
    return details


EXTENSION_SECONDS = 3600  # the console's default extension: one hour


@dataclass(frozen=True)
class ExtensionCost:
    instance_id: int
    machine_id: int
    cost: int  # micro-dollars for another hour


def rental_extension_costs(team_id: int) -> list[ExtensionCost]:
    """What extending each of the team's live rentals by an hour holds, dearest first: GPUs and
    storage, as ``rental_extend`` holds them (a stopped rental too: it may start again)."""
    from marketplace.models import Rental
    from marketplace.services.pricing import extension_quote

    live = Rental.objects.filter(team_id=team_id, settled_at=None).only(
        "instance_id", "machine_id", "price_per_gpu_hour", "gpu_count",
        "storage_price_per_gb_month", "disk_gb",
    )  # fmt: skip
    costs = [
        ExtensionCost(c.instance_id, c.machine_id, extension_quote(c, EXTENSION_SECONDS).total)
        for c in live
    ]
    return sorted(costs, key=lambda c: (-c.cost, c.instance_id))


def low_balance_notice(team_id: int) -> str | None:
    """A warning when available credit would not cover extending one of the team's rentals by
    an hour (each extension holds its cost up front, so each rental is checked on its own)."""
    from billing.selectors import team_balance

    costs = rental_extension_costs(team_id)
    available = team_balance(team_id).available
    short = [c for c in costs if c.cost > available]
    if not short:
        return None
    dearest = short[0]
    if len(short) == 1:
        rental = f"instance {dearest.instance_id} on machine {dearest.machine_id}"
        return (
            f"Low balance: {format_usd(available)} available, and another hour of {rental} "
            f"needs {format_usd(dearest.cost)} (GPUs and storage). Top up so you can extend it."
        )
    return (
        f"Low balance: {format_usd(available)} available, not enough to extend {len(short)} of "
        f"your rentals by an hour (instance {dearest.instance_id} needs the most: "
        f"{format_usd(dearest.cost)}, GPUs and storage). Top up so you can extend them."
    )


def instance_logs(instance: Instance, *, tail: int = 200) -> tuple[str, str]:
    """(log text, note for the reader): the container's last ``tail`` lines, or why not."""
    from hosts.runtime import CommandFailed, DockerHost, HostUnreachable

    if instance.state == InstanceState.DESTROYED:
        return instance.last_log, (
            "The container was removed when the rental was destroyed; these are the last "
            "lines it wrote."
        )
    if not instance.container_id:
        return "", "The container has not started yet."
    host = DockerHost(instance.machine)
    release_database_connection()
    try:
        return host.logs(instance.container_id, tail=tail), ""
    except (CommandFailed, HostUnreachable) as error:
        return "", f"Could not read logs: {error}"


def rental_versions(instance: Instance) -> list[dict[str, object]]:
    """Every version of the instance's spec, oldest first, each with what changed from the
    one before (``changed``: the field names), for the API and the console's Versions tab."""
    from scheduler.models import InstanceVersion
    from scheduler.services import version_spec

    rows = [
        {
            "number": v.number,
            "spec": v.spec,
            "created_at": v.created_at,
            "created_by": v.created_by,
            # A failed version never ran: the one before it runs again (``failure`` says why).
            "state": "failed" if v.failure else "stopped",
            "failure": v.failure,
            "container_id": v.container_id,
            "current": False,
        }
        for v in InstanceVersion.objects.filter(instance=instance).order_by("number")
    ]
    rows.append(
        {
            "number": instance.version,
            "spec": version_spec(instance),
            "created_at": instance.version_at or instance.created_at,
            "created_by": instance.version_by,
            "state": instance.state,
            "failure": "",
            "container_id": instance.container_id,
            "current": True,
        }
    )
    rows.sort(key=lambda row: row["number"])
    previous: dict | None = None
    for row in rows:
        spec = row["spec"]
        row["changed"] = (
            [] if previous is None else sorted(k for k in spec if spec.get(k) != previous.get(k))
        )
        previous = spec
    return rows
