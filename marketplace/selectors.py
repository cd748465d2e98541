"""Reads that take thought: how to connect to an instance."""

from __future__ import annotations

from scheduler.models import Instance, InstanceState, LaunchMode


def instance_connection(instance: Instance) -> dict[str, object]:
    """Ready-to-copy connection details: SSH line, Jupyter URL, published ports."""
    host = instance.machine.address
    ports = [
        {"container_port": p.container_port, "host_port": p.host_port, "protocol": p.protocol,
         "address": f"{host}:{p.host_port}"}
        for p in instance.port_allocations.filter(released_at=None).order_by("container_port")
    ]  # fmt: skip
    by_container = {p["container_port"]: p["host_port"] for p in ports}
    details: dict[str, object] = {"host": host, "ports": ports, "ssh": None, "jupyter": None}
    # Only a running instance gets a line to use: its launch checked that the image has the
    # mode's sshd or jupyter (a launching one may yet fail for want of it).
    live = instance.state == InstanceState.RUNNING
    if instance.launch_mode == LaunchMode.SSH and 22 in by_container:
        details["ssh"] = f"ssh -p {by_container[22]} root@{host}" if live else None
    if instance.launch_mode == LaunchMode.JUPYTER and 8888 in by_container:
        token = instance.jupyter_token
        details["jupyter"] = (
            f"http://{host}:{by_container[8888]}/lab?token={token}" if live else None
        )
    return details


def team_hourly_burn(team_id: int) -> int:
    """Micro-dollars an hour the team's live rentals cost (GPU time and storage)."""
    from marketplace.models import Contract
    from marketplace.services.rentals import storage_owed

    burn = 0
    live = Contract.objects.filter(team_id=team_id, settled_at=None).values_list(
        "price_per_gpu_hour", "gpu_count", "storage_price_per_gb_month", "disk_gb"
    )
    for price, gpus, storage_price, disk in live:
        burn += price * gpus + storage_owed(
            price_per_gb_month=storage_price, disk_gb=disk, seconds=3600
        )
    return burn


def low_balance_notice(team_id: int) -> str | None:
    """A warning when credit would not cover another hour of the team's running rentals."""
    from billing.money import format_usd
    from billing.selectors import team_balance, team_low_balance

    burn = team_hourly_burn(team_id)
    if burn == 0 or not team_low_balance(team_id, burn):
        return None
    available = team_balance(team_id).available
    return (
        f"Low balance: {format_usd(available)} available, and extending your running rentals "
        f"by an hour needs {format_usd(burn)}. Top up so you can extend them."
    )


def instance_logs(instance: Instance, *, tail: int = 200) -> tuple[str, str]:
    """(log text, note for the reader): the container's last ``tail`` lines, or why not."""
    from hosts.runtime import CommandFailed, DockerHost, HostUnreachable

    if not instance.container_id:
        return "", "The container has not started yet."
    try:
        return DockerHost(instance.machine).logs(instance.container_id, tail=tail), ""
    except (CommandFailed, HostUnreachable) as error:
        return "", f"Could not read logs: {error}"
