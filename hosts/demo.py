"""Demo data for `make run`: the simulated hosts become the provider's listed machines."""

from __future__ import annotations

import time
from pathlib import Path

from django.core.exceptions import ValidationError

from hosts import services, ssh
from hosts.keys import team_public_key
from hosts.models import Machine, MachineStatus
from hosts.verification import services as verification

DEMO_PRICES = {  # micro-dollars per GPU-hour, by GPU model
    "NVIDIA A100-SXM4-80GB": 1_450_000,
    "NVIDIA GeForce RTX 4090": 420_000,
    "NVIDIA GeForce RTX 3090": 230_000,
}
DEMO_REGIONS = ["US", "DE", "CA"]
# A host `make run` has just started can fail its first probe on a busy machine (a command past
# its timeout), and a machine in error waits minutes for the heartbeats to probe it again: the
# demo probes again until each machine is online, for this long, then says which is not.
ONLINE_WITHIN_SECONDS = 90.0


def demo_step(users: dict, simhosts: list[dict]) -> str:
    """Register each simulated host (from hosts.json) as a machine of the provider's personal
    team: put the team's platform key in its ``authorized_keys`` (as the provider would), read
    its host key, pin it when it is the one hosts.json names (the run command made
    these hosts, so it vouches for their keys), probe, price, list and verify. Safe to run again:
    existing machines are refreshed, a host whose key changed is re-pinned."""
    provider = users["provider"]
    team_id = provider.memberships.get(team__personal=True).team_id
    listed, problems = [], []
    for number, host in enumerate(simhosts):
        try:
            listed.append(_demo_machine(team_id, number, host))
        except (ssh.HostError, ValueError, ValidationError) as error:
            problems.append(f"{host['name']}: {error}")
    lines = []
    if listed:
        lines.append(f"demo machines listed: {', '.join(listed)}")
    if problems:
        lines.append("demo machines not ready: " + "; ".join(problems))
    return "\n".join(lines)


def _demo_machine(team_id: int, number: int, host: dict) -> str:
    # Development tooling, imported only when demo data is made (see hosts.devtools).
    from hosts.devtools.simulation import authorize_key

    authorize_key(Path(host["root"]), team_public_key(team_id))
    machine = Machine.objects.filter(
        team_id=team_id, address=host["address"], port=host["port"]
    ).first()
    if machine is None:
        machine = services.machine_register(
            team_id=team_id, name=host["name"], address=host["address"], port=host["port"],
            ssh_user=host["user"],
        )  # fmt: skip
    machine = services.machine_fetch_host_key(machine_id=machine.pk)
    if machine.offered_key_fingerprint != host["fingerprint"]:
        raise ValueError(
            f"presents {machine.offered_key_fingerprint or 'no key'}, "
            f"hosts.json says {host['fingerprint']}"
        )
    if machine.host_key != machine.offered_key:
        services.machine_confirm_host_key(machine_id=machine.pk, fingerprint=host["fingerprint"])
    _probe_until_online(machine.pk)
    services.machine_set_terms(
        machine_id=machine.pk,
        price_per_gpu_hour=DEMO_PRICES.get(host["gpus"][0]["name"], 500_000),
        storage_price_per_gb_month=100_000,
        min_gpus=1,
        end_date=None,
        location=DEMO_REGIONS[number % len(DEMO_REGIONS)],
        port_range_start=host["port_range"][0],
        port_range_end=host["port_range"][1],
    )
    services.machine_set_listed(machine_id=machine.pk, listed=True)
    services.machine_heartbeat(machine_id=machine.pk)  # a first point for reliability
    # Verified as any machine is, by a self-test and a benchmark (their GPU figures simulated,
    # and marked so), so the vastai CLI's default search (verified=true) shows them.
    machine = verification.machine_verify(machine_id=machine.pk)
    if not machine.verified:
        raise ValueError(f"listed, but not verified: {machine.verification_detail}")
    return machine.name


def _probe_until_online(machine_id: int) -> None:
    """Probe until the machine is online; ValueError with the last problem after
    ``ONLINE_WITHIN_SECONDS``. A host that presents another key is never retried."""
    deadline = time.monotonic() + ONLINE_WITHIN_SECONDS
    while True:
        try:
            machine = services.machine_probe(machine_id=machine_id)
        except ssh.HostKeyMismatch:
            raise
        except (ssh.HostError, ValueError) as error:
            problem = str(error)
        else:
            if machine.status == MachineStatus.ONLINE:
                return
            problem = "; ".join(machine.probe_problems) or f"it is {machine.status}"
        if time.monotonic() >= deadline:
            raise ValueError(f"not online after {ONLINE_WITHIN_SECONDS:.0f} s: {problem}")
        time.sleep(1)
