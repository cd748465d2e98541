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
    live = instance.state in (InstanceState.RUNNING, InstanceState.LAUNCHING)
    if instance.launch_mode == LaunchMode.SSH and 22 in by_container:
        details["ssh"] = f"ssh -p {by_container[22]} root@{host}" if live else None
    if instance.launch_mode == LaunchMode.JUPYTER and 8888 in by_container:
        token = instance.jupyter_token
        details["jupyter"] = (
            f"http://{host}:{by_container[8888]}/lab?token={token}" if live else None
        )
    return details
