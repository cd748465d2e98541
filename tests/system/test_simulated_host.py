"""The simulated host is real SSH and real Docker; only nvidia-smi is a stand-in."""

from __future__ import annotations

import base64

import paramiko
import pytest

from hosts.keys import team_private_key, team_public_key
from tests.conftest import sim_container_label

pytestmark = pytest.mark.system


TEAM_ID = 0  # no team has it: the key is authorized here only to log in as the platform would


def connect(host, host_key: str | None = None) -> paramiko.SSHClient:
    host.authorize(team_public_key(TEAM_ID))
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())  # never auto-add
    if host_key is not None:
        kind, blob = host_key.split()[:2]
        client.get_host_keys().add(
            f"[{host.address}]:{host.port}", kind, paramiko.Ed25519Key(data=base64.b64decode(blob))
        )
    client.connect(
        host.address, host.port, username=host.user, pkey=team_private_key(TEAM_ID),
        allow_agent=False, look_for_keys=False, timeout=10,
    )  # fmt: skip
    return client


def run(client: paramiko.SSHClient, command: str) -> tuple[int, str, str]:
    _, stdout, stderr = client.exec_command(command, timeout=60)
    code = stdout.channel.recv_exit_status()
    return code, stdout.read().decode(), stderr.read().decode()


def test_unknown_host_key_is_rejected(sim_host):
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(sim_host)


def test_nvidia_smi_lists_the_configured_gpus_in_real_csv(sim_host):
    with connect(sim_host, sim_host.host_public_key) as client:
        code, out, _ = run(
            client,
            "nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version --format=csv,noheader,nounits",
        )
    assert code == 0
    rows = [line.split(", ") for line in out.strip().splitlines()]
    assert rows == [
        [str(g.index), g.uuid, g.name, str(g.memory_mib), g.driver_version]
        for g in sim_host.spec.gpus
    ]


def test_container_prints_and_exits_through_ssh(sim_host, docker_engine):
    with connect(sim_host, sim_host.host_public_key) as client:
        code, out, err = run(
            client,
            f"docker run --rm --label {sim_container_label()} {docker_engine} sh -c 'echo hello from $(hostname)'",
        )
    assert code == 0, err
    assert out.startswith("hello from ")


def test_simulated_gpu_uuids_follow_the_host_name_and_index():
    from hosts.devtools.simulation import SimHostSpec, default_gpus
    from hosts.runtime import GPU_UUID

    def uuids(name: str) -> list[str]:
        spec = SimHostSpec(name=name, address="127.0.0.10", port=2201, gpus=default_gpus(3))
        return [gpu.uuid for gpu in spec.gpus]

    first = uuids("sim-a100")
    assert first == uuids("sim-a100")  # every `make run` makes the same GPUs
    assert len(set(first)) == 3 and not set(first) & set(uuids("sim-rtx4090"))
    assert all(GPU_UUID.fullmatch(uuid) for uuid in first)  # GPU-xxxxxxxx-xxxx-… as nvidia-smi


def test_simhosts_never_leaves_a_stale_hosts_json(tmp_path, docker_engine):
    """A run that fails to start its hosts leaves no hosts.json behind (the run command would
    hand the last run's file to demo_data); one that starts them writes the file whole."""
    import json
    import os

    from django.core.management import call_command

    namespace = int(os.environ.get("TEST_NAMESPACE", "0"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    port = 26000 + namespace * 100 + worker * 10
    listing = tmp_path / "hosts.json"
    listing.write_text('[{"name": "from the last run"}]')
    blocker = tmp_path / "sim-rtx4090"
    blocker.write_text("a file where the host's directory goes: the host cannot be made")
    with pytest.raises(FileExistsError):
        call_command("simhosts", count=1, dir=str(tmp_path), base_port=port, detach=True)
    assert not listing.exists()
    blocker.unlink()
    call_command("simhosts", count=1, dir=str(tmp_path), base_port=port, detach=True)
    try:
        hosts = json.loads(listing.read_text())
        assert [(h["name"], h["port"]) for h in hosts] == [("sim-rtx4090", port)]
        assert not list(tmp_path.glob("*.tmp"))
    finally:
        from hosts.devtools.simulation import SimHost, SimHostSpec

        spec = SimHostSpec(name="sim-rtx4090", address="127.0.0.10", port=port, gpus=())
        SimHost(spec=spec, root=tmp_path / "sim-rtx4090").stop()
