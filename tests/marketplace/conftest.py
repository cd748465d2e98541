"""Fixtures for renting: a provider's listed machine on a simulated host, a funded renter team."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from django.utils import timezone

from billing.credits import credit_grant
from billing.money import MICRO_PER_DOLLAR
from hosts.keys import team_public_key
from hosts.models import Gpu, Machine
from marketplace.models import Role, Team
from marketplace.services.offers import offer_refresh
from tests.conftest import sim_container_label
from tests.factories import TeamFactory, UserFactory, add_member

PRICE_PER_GPU_HOUR = 500_000  # $0.50
STORAGE_PER_GB_MONTH = 100_000  # $0.10


@pytest.fixture(autouse=True)
def _label_test_containers(request, settings):
    """Every container the platform starts here carries this worker's label, and each test
    that reaches Docker removes its own, so the next test on the same simulated host finds its
    ports free. A test that reaches no Docker Engine (no simulated host, no system mark) has
    none to remove: asking Docker anyway cost each of the hundreds of such tests a ``docker
    ps`` or two."""
    label = sim_container_label()
    key, value = label.split("=", 1)
    settings.CONTAINER_EXTRA_LABELS = {key: value}
    yield
    if reaches_docker(request):
        remove_containers(label)


def reaches_docker(request) -> bool:
    """Whether a test can start containers: it uses the Docker Engine (every simulated host
    does, through ``docker_engine``) or is marked a system test."""
    return "docker_engine" in request.fixturenames or bool(
        request.node.get_closest_marker("system")
    )


def engines() -> list[dict[str, str] | None]:
    """The environments that reach each Docker Engine tests use: the system's, and the
    enforced-disk one once it runs."""
    from hosts.devtools.sim_docker import QUOTA_DOCKER_SOCKET

    found: list[dict[str, str] | None] = [None]
    if Path(QUOTA_DOCKER_SOCKET.removeprefix("unix://")).exists():
        found.append({**os.environ, "DOCKER_HOST": QUOTA_DOCKER_SOCKET})
    return found


def remove_containers(label: str) -> None:
    for env in engines():
        ids = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={label}"],
            capture_output=True,
            text=True,
            env=env,
        ).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "--force", *ids], capture_output=True, env=env)


@pytest.fixture
def provider_team(db) -> Team:
    team = TeamFactory(name="GPU Provider Inc")
    add_member(team, UserFactory(username="provider"), Role.OWNER)
    return team


def machine_for(sim_host, provider_team: Team, **terms) -> Machine:
    """The Machine row a provider gets after add → confirm → probe → list on this host.

    The figures are the host's real ones (cores, memory) and its configured GPUs.
    """
    sim_host.authorize(team_public_key(provider_team.pk))  # as the provider does first
    kind, key = sim_host.host_public_key.split()[:2]
    memory_kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    machine = Machine.objects.create(
        team=provider_team,
        name=sim_host.spec.name,
        address=sim_host.address,
        port=sim_host.port,
        ssh_user=sim_host.user,
        host_key_type=kind,
        host_key=key,
        host_key_fingerprint=sim_host.host_key_fingerprint,
        status="online",
        listed=terms.pop("listed", True),
        price_per_gpu_hour=terms.pop("price_per_gpu_hour", PRICE_PER_GPU_HOUR),
        storage_price_per_gb_month=terms.pop("storage_price_per_gb_month", STORAGE_PER_GB_MONTH),
        min_gpus=terms.pop("min_gpus", 1),
        location=terms.pop("location", "US"),
        cpu_cores=os.cpu_count(),
        ram_mb=memory_kb // 1024,
        disk_free_gb=200,
        docker_version="20.10",
        nvidia_runtime=False,
        driver_version=sim_host.spec.gpus[0].driver_version,
        cuda_version=sim_host.spec.cuda_version,
        port_range_start=sim_host.spec.port_range[0],
        port_range_end=sim_host.spec.port_range[1],
        reliability=1.0,
        last_heartbeat_at=timezone.now(),
        verified=True,
        **terms,
    )
    Gpu.objects.bulk_create(
        [
            Gpu(
                machine=machine,
                index=g.index,
                uuid=g.uuid,
                name=g.name,
                memory_mib=g.memory_mib,
                present=True,
            )
            for g in sim_host.spec.gpus
        ]
    )
    offer_refresh(machine_id=machine.pk)
    return machine


@pytest.fixture
def machine(sim_host, provider_team) -> Machine:
    return machine_for(sim_host, provider_team)


def fund(team: Team, dollars: int = 100) -> None:
    credit_grant(
        team_id=team.pk, amount=dollars * MICRO_PER_DOLLAR, reason="test credit",
        idempotency_key=f"test-fund-{team.pk}-{dollars}",
    )  # fmt: skip


@pytest.fixture
def funded_team(team, owner) -> Team:
    fund(team)
    return team


def docker(*argv: str, machine: Machine | None = None, check: bool = True):
    """``docker …`` on the engine a machine's sessions reach (the system's by default)."""
    env = None
    if machine is not None and machine.disk_enforced:
        from hosts.devtools.sim_docker import QUOTA_DOCKER_SOCKET

        env = {**os.environ, "DOCKER_HOST": QUOTA_DOCKER_SOCKET}
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=check, env=env)


def docker_inspect(container_id: str, machine: Machine | None = None) -> dict:
    import json

    return json.loads(docker("inspect", container_id, machine=machine).stdout)[0]


def containers_named(name: str) -> list[str]:
    return subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"name=^/{name}$"], capture_output=True, text=True
    ).stdout.split()


def until(done, timeout: float = 30) -> None:
    """Wait until ``done()`` is true (polling); the test fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)
