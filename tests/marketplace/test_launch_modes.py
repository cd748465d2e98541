"""Launch modes, honestly: SSH mode on an image with a real sshd lets the renter log in with
the team's key through the published port; an image without sshd or jupyter fails the launch
with a reason saying so, and no ssh line or token URL is shown for it."""

from __future__ import annotations

import base64
import socket
import subprocess
import time

import paramiko
import pytest

from hosts.runtime import docker_run_argv
from scheduler import services as scheduler
from scheduler.models import GpuAllocation, Instance, PortAllocation
from tests.conftest import key_client
from tests.marketplace.conftest import containers_named

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def ssh_image(docker_engine):
    from hosts.devtools.sim_docker import ensure_ssh_image

    return ensure_ssh_image()


def make_key(path) -> paramiko.Ed25519Key:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "renter@laptop", "-f", str(path)],
        check=True,
    )
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def rent(client, machine, **fields):
    body = {"machine_id": machine.pk, "num_gpus": 1, "duration_hours": 1, "ports": [], **fields}
    response = client.post("/api/v1/instances/", body, format="json")
    assert response.status_code == 201, response.content
    return client.get(f"/api/v1/instances/{response.json()['id']}/").json()


def login(address: str, port: int, key: paramiko.PKey, host_key: str) -> paramiko.SSHClient:
    """Log in as the renter would, trusting only the host key the container showed us."""
    kind, blob = host_key.split()[:2]
    client = paramiko.SSHClient()
    pinned = paramiko.PKey.from_type_string(kind, base64.b64decode(blob))
    client.get_host_keys().add(f"[{address}]:{port}", kind, pinned)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    deadline = time.monotonic() + 30  # sshd makes its host keys at start
    while True:
        try:
            client.connect(
                address, port, username="root", pkey=key, allow_agent=False,
                look_for_keys=False, timeout=5, banner_timeout=5, auth_timeout=5,
            )  # fmt: skip
            return client
        except paramiko.AuthenticationException:
            raise
        except (paramiko.SSHException, OSError, EOFError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def host_key_of(client, instance_id: int) -> str:
    """The container's sshd host key, read with the exec API (sshd makes it at start)."""
    deadline = time.monotonic() + 30
    while True:
        shown = client.post(
            f"/api/v1/instances/{instance_id}/exec/",
            {"command": "cat /etc/ssh/ssh_host_ed25519_key.pub"},
            format="json",
        ).json()
        if shown["exit_code"] == 0 or time.monotonic() > deadline:
            assert shown["exit_code"] == 0, shown
            return shown["output"]
        time.sleep(0.3)


def test_ssh_mode_lets_the_renter_log_in_with_the_team_key(
    funded_team, machine, ssh_image, tmp_path
):
    client = key_client(funded_team)
    key = make_key(tmp_path / "id_ed25519")
    public_key = (tmp_path / "id_ed25519.pub").read_text().strip()
    assert (
        client.post(
            "/api/v1/ssh-keys/", {"name": "laptop", "public_key": public_key}, format="json"
        ).status_code
        == 201
    )

    body = rent(client, machine, image=ssh_image, launch_mode="ssh")
    assert body["state"] == "running", body["status_message"]
    port = PortAllocation.objects.get(instance_id=body["id"], container_port=22).host_port
    assert body["connection"]["ssh"] == f"ssh -p {port} root@{machine.address}"
    shown = host_key_of(client, body["id"])
    session = login(machine.address, port, key, shown)
    try:
        _, stdout, _ = session.exec_command("echo hello from $(hostname); id -u")
        out = stdout.read().decode()
        assert stdout.channel.recv_exit_status() == 0
    finally:
        session.close()
    container_id = Instance.objects.get(pk=body["id"]).container_id
    assert out.split() == ["hello", "from", container_id[:12], "0"]

    stranger = make_key(tmp_path / "stranger")
    with pytest.raises(paramiko.AuthenticationException):
        login(machine.address, port, stranger, shown)


def test_ssh_mode_shows_running_only_once_sshd_answers(funded_team, machine, ssh_image):
    """The bootstrap makes host keys before sshd listens: until then the instance says
    "Starting sshd" and stays launching, so the first connection after *running* gets sshd's
    banner, not a refusal."""
    client = key_client(funded_team)
    body = rent(client, machine, image=ssh_image, launch_mode="ssh")
    assert body["state"] == "running", body["status_message"]
    port = PortAllocation.objects.get(instance_id=body["id"], container_port=22).host_port
    with socket.create_connection((machine.address, port), timeout=5) as connection:
        connection.settimeout(5)
        assert connection.recv(64).startswith(b"SSH-2.0-")
    assert body["status_message"] == "Container started; sshd answers"


@pytest.mark.parametrize(
    ("mode", "reason", "line"),
    [
        ("ssh", "image has no sshd; use an image with an OpenSSH server installed", "ssh"),
        ("jupyter", "image has no jupyter; use an image with Jupyter installed", "jupyter"),
    ],
)
def test_an_image_without_the_mode_program_fails_with_the_reason(
    funded_team, machine, mode, reason, line
):
    client = key_client(funded_team)
    body = rent(client, machine, image="gpumkt/busybox:latest", launch_mode=mode)
    assert body["state"] == "failed"
    assert body["status_message"] == f"Launch failed: {reason}"
    assert body["connection"][line] is None and body["connection"]["ssh"] is None
    instance = Instance.objects.get(pk=body["id"])
    assert instance.events.last().reason == f"Launch failed: {reason}"
    assert containers_named(instance.container_name) == []
    assert not GpuAllocation.objects.filter(instance=instance, released_at=None).exists()


def test_jupyter_mode_runs_jupyter_lab_with_the_token_on_the_published_port(funded_team, machine):
    client = key_client(funded_team)
    body = rent(client, machine, image="gpumkt/busybox:latest", launch_mode="jupyter")
    instance = Instance.objects.get(pk=body["id"])
    host_port = PortAllocation.objects.get(instance=instance, container_port=8888).host_port
    spec = scheduler.container_spec_for(instance)
    argv = docker_run_argv(spec, machine_id=machine.pk, nvidia_runtime=False)
    image_at = argv.index("gpumkt/busybox:latest")
    assert argv[image_at - 2 : image_at] == ["--entrypoint", "sh"]
    assert argv[image_at + 1 :] == ["-c", scheduler.JUPYTER_BOOTSTRAP]
    assert (
        "exec jupyter lab --ip=0.0.0.0 --port=8888 --allow-root --no-browser "
        '--ServerApp.token="$JUPYTER_TOKEN"'
    ) in scheduler.JUPYTER_BOOTSTRAP
    assert f"JUPYTER_TOKEN={instance.jupyter_token}" in argv
    assert len(instance.jupyter_token) >= 32
    assert f"{host_port}:8888/tcp" in argv
    # The token is the renter's alone: not in the API's view of the instance except the URL,
    # and no URL while it is not running with Jupyter.
    assert body["connection"]["jupyter"] is None
    assert instance.jupyter_token not in str(body)


def test_a_rental_stopped_before_its_container_existed_is_launched_again_with_the_keys(
    funded_team, machine, ssh_image, tmp_path
):
    """A rental stopped while it was still launching has no container; start launches it
    again (through a worker, not inside the request), with the team's SSH keys like the first
    launch, and the renter logs in."""
    client = key_client(funded_team)
    key = make_key(tmp_path / "id_ed25519")
    public_key = (tmp_path / "id_ed25519.pub").read_text().strip()
    client.post("/api/v1/ssh-keys/", {"name": "laptop", "public_key": public_key}, format="json")
    body = rent(client, machine, image=ssh_image, launch_mode="ssh")
    assert body["state"] == "running", body
    # As a stop that came before `docker run` leaves it: stopped, no container, no GPUs.
    instance = Instance.objects.get(pk=body["id"])
    subprocess.run(["docker", "rm", "-f", instance.container_id], check=True, capture_output=True)
    client.post(f"/api/v1/instances/{instance.pk}/stop/")
    Instance.objects.filter(pk=instance.pk).update(container_id="")

    started = client.post(f"/api/v1/instances/{instance.pk}/start/", format="json")
    assert started.status_code == 200, started.content
    body = client.get(f"/api/v1/instances/{instance.pk}/").json()
    assert body["state"] == "running", body["status_message"]
    events = [e.to_state for e in Instance.objects.get(pk=instance.pk).events.all()]
    assert events[-2:] == ["launching", "running"]
    port = PortAllocation.objects.get(instance_id=body["id"], container_port=22).host_port
    session = login(machine.address, port, key, host_key_of(client, body["id"]))
    session.close()
