"""Helpers for hosts tests: a provider's machine on a simulated host, the way a provider adds it."""

from __future__ import annotations

import json
import subprocess

from hosts import services
from hosts.keys import team_public_key
from hosts.models import Machine


def add_and_confirm(team, host, name: str = "") -> Machine:
    host.authorize(team_public_key(team.pk))  # the provider lets the team's key in first
    machine = services.machine_register(
        team_id=team.pk,
        name=name or host.spec.name,
        address=host.address,
        port=host.port,
        ssh_user=host.user,
    )
    services.machine_fetch_host_key(machine_id=machine.pk)
    return services.machine_confirm_host_key(
        machine_id=machine.pk, fingerprint=host.host_key_fingerprint
    )


def online_machine(team, host, name: str = "") -> Machine:
    machine = add_and_confirm(team, host, name)
    return services.machine_probe(machine_id=machine.pk)


def containers(*filters: str) -> list[dict]:
    """Containers on the one Docker engine, asked directly (not through our code)."""
    argv = ["docker", "ps", "-a", "--no-trunc", "--format", "{{json .}}"]
    for item in filters:
        argv += ["--filter", item]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def docker_inspect(container: str) -> dict:
    out = subprocess.run(
        ["docker", "container", "inspect", container], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)[0]
