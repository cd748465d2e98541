"""DockerHost against a simulated host: the container really gets its limits, env and labels."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from hosts import ssh
from hosts.runtime import CommandFailed, ContainerSpec, DockerHost, InvalidContainerSpec
from tests.conftest import sim_container_label
from tests.hosts.support import containers, docker_inspect, online_machine

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def nasty(marker: Path) -> str:
    """Text that creates ``marker`` wherever a shell expands it (on the host, were our argv
    pasted into the SSH command line unquoted)."""
    return f"hello; $(touch {marker}) `touch {marker}` 'q' \"dq\"\nsecond line"


def label() -> dict[str, str]:
    key, value = sim_container_label().split("=", 1)
    return {key: value}


def echo(host: DockerHost, container: str, variable: str) -> str:
    return host.exec(container, ["sh", "-c", f'printf %s "${variable}"']).stdout


def test_a_container_runs_with_the_units_limits_env_ports_and_gpus(team, sim_host, docker_engine):
    machine = online_machine(team, sim_host)
    # The simulated host's sshd runs its sessions on this machine: a shell injection through
    # our SSH command line would create this file here, so here is where to look for it.
    marker = Path("/tmp") / f"gpumkt-injected-{uuid.uuid4().hex}"
    text = nasty(marker)
    # The control: a command through the same SSH transport does land in this machine's /tmp.
    control = marker.with_name(marker.name + "-control")
    ssh.run(machine, ["touch", str(control)])
    assert control.exists()
    control.unlink()
    gpus = [g.uuid for g in sim_host.spec.gpus[:2]]
    port = sim_host.spec.port_range[0]
    spec = ContainerSpec(
        name=f"gpumkt-t-{machine.pk}-limits",
        image=docker_engine,
        cpus=1.5,
        memory_mb=256,
        shm_mb=64,
        labels={**label(), "gpumkt.instance": "test-1"},
        env={"GREETING": text, "NVIDIA_VISIBLE_DEVICES": "all"},
        ports=[(8080, port, "tcp")],
        gpu_uuids=gpus,
        entrypoint="sh",
        args=["-c", "echo started; exec sleep 300"],
    )
    host = DockerHost(machine)
    container = host.run(spec)
    try:
        seen = docker_inspect(container)  # asked of Docker directly, not through our code
        assert seen["HostConfig"]["NanoCpus"] == 1_500_000_000
        assert seen["HostConfig"]["Memory"] == 256 * 1024 * 1024
        assert seen["HostConfig"]["ShmSize"] == 64 * 1024 * 1024
        assert seen["HostConfig"]["Privileged"] is False
        assert seen["HostConfig"]["NetworkMode"] != "host"
        assert not seen["HostConfig"]["Binds"]
        assert seen["HostConfig"]["PortBindings"] == {
            "8080/tcp": [{"HostIp": "", "HostPort": str(port)}]
        }
        assert seen["Config"]["Labels"]["gpumkt.platform"] == "1"
        assert seen["Config"]["Labels"]["gpumkt.machine"] == str(machine.pk)
        # The renter's NVIDIA_VISIBLE_DEVICES=all was dropped; the platform's pinning stands.
        assert echo(host, container, "NVIDIA_VISIBLE_DEVICES") == ",".join(gpus)
        assert echo(host, container, "GREETING") == text
        # Read back from inside, on cgroup v2 or v1 (whichever this kernel mounts).
        cpu = "cat /sys/fs/cgroup/cpu.max || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"
        memory = "cat /sys/fs/cgroup/memory.max || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
        assert host.exec(container, ["sh", "-c", cpu]).stdout.split()[0] == "150000"
        assert host.exec(container, ["sh", "-c", memory]).stdout.split()[0] == str(256 << 20)
        shm = host.exec(container, ["df", "-k", "/dev/shm"]).stdout.splitlines()[-1].split()
        assert shm[1] == str(64 * 1024)
        assert "started" in host.logs(container, tail=10)
        # Not expanded on the host by `docker run`, `docker exec`, or `docker logs`, nor in
        # the container by the env var's reader (checked inside as well).
        assert not marker.exists(), "the renter's text ran as a command on the host"
        assert host.exec(container, ["ls", str(marker)]).exit_code != 0
        listed = {c.id: c for c in host.list_platform_containers()}
        assert listed[container].running and listed[container].instance == "test-1"
    finally:
        host.remove(container)
    assert containers(f"id={container}") == []


def test_stop_start_inspect_and_remove(team, sim_host, docker_engine):
    machine = online_machine(team, sim_host)
    host = DockerHost(machine)
    spec = ContainerSpec(
        name=f"gpumkt-t-{machine.pk}-cycle", image=docker_engine, cpus=0.5, memory_mb=64,
        shm_mb=16, labels=label(), entrypoint="sleep", args=["300"],
    )  # fmt: skip
    container = host.run(spec)
    try:
        host.stop(container, grace_seconds=1)
        assert host.inspect(container)["State"]["Status"] == "exited"
        host.start(container)
        assert host.inspect(container)["State"]["Running"] is True
        result = host.exec(container, ["sh", "-c", "exit 3"])
        assert result.exit_code == 3
    finally:
        host.remove(container)
    with pytest.raises(CommandFailed):
        host.inspect(container)


def test_platform_containers_are_listed_per_machine(team, sim_host_factory, docker_engine):
    """Simulated hosts share one Docker engine: the machine label keeps their lists apart."""
    first = online_machine(team, sim_host_factory(gpus=1), name="first")
    second = online_machine(team, sim_host_factory(gpus=1), name="second")
    spec = ContainerSpec(
        name=f"gpumkt-t-{first.pk}-mine", image=docker_engine, cpus=0.5, memory_mb=64,
        shm_mb=16, labels=label(), entrypoint="sleep", args=["300"],
    )  # fmt: skip
    container = DockerHost(first).run(spec)
    try:
        # (Other sessions' databases reuse machine ids on this shared engine, so look for
        # this container rather than expecting the only one.)
        assert container in [c.id for c in DockerHost(first).list_platform_containers()]
        assert container not in [c.id for c in DockerHost(second).list_platform_containers()]
    finally:
        DockerHost(first).remove(container)


def test_image_present_and_volumes(team, sim_host, docker_engine):
    machine = online_machine(team, sim_host)
    host = DockerHost(machine)
    assert host.image_present(docker_engine) is True
    assert host.image_present("gpumkt/not-here:0") is False
    name = f"gpumkt-t-vol-{machine.pk}"
    host.volume_create(name)
    try:
        assert name in host._run(["docker", "volume", "ls", "--format", "{{.Name}}"]).stdout

        def run_with_volume(suffix: str, script: str) -> str:
            return host.run(
                ContainerSpec(
                    name=f"gpumkt-t-{machine.pk}-vol-{suffix}", image=docker_engine, cpus=0.5,
                    memory_mb=64, shm_mb=8, labels=label(), volumes=[(name, "/workspace")],
                    entrypoint="sh", args=["-c", script],
                )
            )  # fmt: skip

        # What one container writes to the volume, the next one reads: the data outlives it.
        first = run_with_volume("w", "echo kept > /workspace/note")
        deadline = time.monotonic() + 30
        while host.inspect(first)["State"]["Running"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert host.inspect(first)["State"]["ExitCode"] == 0
        mounts = docker_inspect(first)["Mounts"]
        assert [(m["Type"], m["Name"], m["Destination"]) for m in mounts] == [
            ("volume", name, "/workspace")
        ]
        assert not docker_inspect(first)["HostConfig"]["Binds"]  # never a host path
        host.remove(first)
        second = run_with_volume("r", "cat /workspace/note; sleep 30")
        try:
            deadline = time.monotonic() + 30
            while "kept" not in host.logs(second, tail=5) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "kept" in host.logs(second, tail=5)
        finally:
            host.remove(second)
    finally:
        host.volume_remove(name)
    assert name not in host._run(["docker", "volume", "ls", "--format", "{{.Name}}"]).stdout


@pytest.mark.parametrize("ref", ["--all", "a b", "$(id)", "x;y", ""])
def test_container_references_that_look_like_options_are_refused(team, sim_host, ref):
    host = DockerHost(online_machine(team, sim_host))
    with pytest.raises(InvalidContainerSpec) as caught:
        host.remove(ref)
    assert caught.value.field == "container"


def test_a_noisy_containers_log_stays_under_its_cap(team, sim_host, docker_engine):
    """Docker keeps every line of a json-file log unless told otherwise; with the cap it keeps
    at most max-file files of max-size each (a small cap here, so the test is quick)."""
    machine = online_machine(team, sim_host)
    host = DockerHost(machine)
    # ~4 MB of numbered 100-byte lines, then quiet: 30 times the cap below.
    script = (
        'pad=$(printf "%090d" 0); i=0; '
        'while [ $i -lt 40000 ]; do echo "$i $pad"; i=$((i+1)); done; echo done; exec sleep 300'
    )
    container = host.run(
        ContainerSpec(
            name=f"gpumkt-t-{machine.pk}-noisy", image=docker_engine, cpus=1, memory_mb=64,
            shm_mb=8, labels=label(), entrypoint="sh", args=["-c", script],
            log_max_kb=64, log_max_files=2,
        )
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "done" not in host.logs(container, tail=1) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert host.logs(container, tail=2).split()[0] == "39999"  # it did print it all
        seen = docker_inspect(container)  # asked of Docker directly
        assert seen["HostConfig"]["LogConfig"] == {
            "Type": "json-file",
            "Config": {"max-file": "2", "max-size": "64k"},
        }
        log = Path(seen["LogPath"])  # the engine is on this machine: its files are here
        files = sorted(log.parent.glob(log.name + "*"))
        assert 1 <= len(files) <= 2, files
        # Each json-file line is ~150 bytes for these 100 bytes of output: uncapped, 6 MB.
        total = sum(f.stat().st_size for f in files)
        assert total <= 2 * 64 * 1024 + 1024, total
    finally:
        host.remove(container)


def test_containers_get_the_default_log_cap(team, sim_host, docker_engine):
    machine = online_machine(team, sim_host)
    host = DockerHost(machine)
    container = host.run(
        ContainerSpec(
            name=f"gpumkt-t-{machine.pk}-logcap", image=docker_engine, cpus=0.5, memory_mb=64,
            shm_mb=8, labels=label(), entrypoint="sleep", args=["300"],
        )
    )  # fmt: skip
    try:
        assert docker_inspect(container)["HostConfig"]["LogConfig"] == {
            "Type": "json-file",
            "Config": {"max-file": "3", "max-size": "10240k"},
        }
    finally:
        host.remove(container)
