"""DockerHost over real SSH on a simulated host: following logs as lines arrive, and a
container's CPU weight by units."""

from __future__ import annotations

import pytest

from hosts.runtime import ContainerSpec, DockerHost
from tests.conftest import sim_container_label
from tests.hosts.support import containers, docker_inspect, online_machine

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def labels() -> dict[str, str]:
    key, value = sim_container_label().split("=", 1)
    return {key: value}


def test_logs_follow_yields_new_lines_as_the_container_writes_them(team, sim_host, docker_engine):
    machine = online_machine(team, sim_host)
    host = DockerHost(machine)
    # It prints one line, then the next only once told to (a file the test creates inside
    # it), so the second line can only come through a stream that is still open.
    script = (
        "echo first line; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second line; sleep 600"
    )
    container = host.run(
        ContainerSpec(
            name=f"gpumkt-follow-{machine.pk}", image=docker_engine, cpus=0.5, memory_mb=64,
            shm_mb=8, labels=labels(), entrypoint="sh", args=["-c", script],
        )
    )  # fmt: skip
    lines = host.logs_follow(container, tail=10, timeout=60)
    try:
        assert next(lines) == "first line"
        # A short command on the same machine while the stream is open.
        assert host.exec(container, ["touch", "/tmp/go"]).exit_code == 0
        assert next(lines) == "second line"
    finally:
        lines.close()  # the follower's session ends with the generator
        host.remove(container)
    assert containers(f"id={container}") == []


def test_cpu_weight_follows_the_units(team, sim_host, docker_engine):
    machine = online_machine(team, sim_host)
    host = DockerHost(machine)
    made = []
    try:
        for units in (1, 3):
            made.append(
                host.run(
                    ContainerSpec(
                        name=f"gpumkt-weight-{machine.pk}-{units}", image=docker_engine,
                        cpus=0.5 * units, memory_mb=64, shm_mb=8, labels=labels(),
                        entrypoint="sleep", args=["600"],
                    )
                )
            )  # fmt: skip
        one, three = (docker_inspect(c)["HostConfig"] for c in made)
        assert (one["NanoCpus"], three["NanoCpus"]) == (0.5e9, 1.5e9)
        assert three["CpuShares"] == 3 * one["CpuShares"] == 3 * 512
    finally:
        for container in made:
            host.remove(container)
