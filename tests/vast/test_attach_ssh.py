"""``vastai attach ssh`` / ``detach ssh`` on a running SSH-mode instance (real sshd in the
container, on a simulated host): an attached key logs in at once, a detached one no longer
does; the bodies are the CLI 1.9.1's (vastai/api/keys.py attach_ssh, detach_ssh)."""

from __future__ import annotations

import paramiko
import pytest

from marketplace.models import SshKey
from scheduler.models import PortAllocation
from tests.conftest import key_client
from tests.marketplace.test_launch_modes import host_key_of, login, make_key, rent, ssh_image

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]
_ = ssh_image  # the fixture, imported for this module


def test_an_attached_key_logs_in_and_a_detached_one_no_longer_does(
    funded_team, machine, ssh_image, tmp_path
):
    client = key_client(funded_team)
    key = make_key(tmp_path / "id_ed25519")
    public_key = (tmp_path / "id_ed25519.pub").read_text().strip()
    body = rent(client, machine, image=ssh_image, launch_mode="ssh")  # no team key yet
    assert body["state"] == "running", body["status_message"]
    port = PortAllocation.objects.get(instance_id=body["id"], container_port=22).host_port
    shown = host_key_of(client, body["id"])
    with pytest.raises(paramiko.AuthenticationException):
        login(machine.address, port, key, shown)

    attached = client.post(
        f"/api/v0/instances/{body['id']}/ssh/", {"ssh_key": public_key}, format="json"
    )
    assert attached.status_code == 200, attached.content
    key_id = attached.json()["key_id"]
    assert SshKey.objects.get(pk=key_id).team == funded_team  # kept for later launches
    again = client.post(
        f"/api/v0/instances/{body['id']}/ssh/", {"ssh_key": public_key}, format="json"
    )
    assert again.status_code == 200 and again.json()["key_id"] == key_id
    session = login(machine.address, port, key, shown)
    try:
        _, stdout, _ = session.exec_command("grep -c ssh-ed25519 /root/.ssh/authorized_keys")
        assert stdout.read().decode().strip() == "1"  # attached twice, written once
    finally:
        session.close()

    detached = client.delete(f"/api/v0/instances/{body['id']}/ssh/{key_id}/")
    assert detached.status_code == 200, detached.content
    with pytest.raises(paramiko.AuthenticationException):
        login(machine.address, port, key, shown)


def test_keys_go_only_into_running_ssh_mode_instances(funded_team, machine, tmp_path):
    client = key_client(funded_team)
    make_key(tmp_path / "id_ed25519")
    public_key = (tmp_path / "id_ed25519.pub").read_text().strip()
    body = rent(client, machine, image="gpumkt/busybox:latest", entrypoint="sleep", args=["600"])
    response = client.post(
        f"/api/v0/instances/{body['id']}/ssh/", {"ssh_key": public_key}, format="json"
    )
    assert response.status_code == 409, response.content
    assert "Only SSH-mode instances take SSH keys" in response.json()["msg"]
    assert not SshKey.objects.exists()  # nothing kept on the team either
