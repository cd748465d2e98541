"""``vastai copy`` on real hosts: ``PUT /commands/rsync/`` opens an SSH-mode instance to the
renter's rsync, which then copies as CLI 1.9.1 runs it (vastai/cli/commands/storage.py copy:
``rsync -arz … -e "ssh -p <port> …" <src> vastai_kaalia@<addr>::<id>/<path>``), and
``PUT /commands/copy_direct/`` copies between two of the team's instances. Names with shell
metacharacters arrive as names; other teams' instances are not there."""

from __future__ import annotations

import subprocess

import pytest

from marketplace.models import Role
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund, machine_for
from tests.marketplace.test_launch_modes import host_key_of, make_key, rent, ssh_image

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]
_ = ssh_image  # the fixture, imported for this module


def cli_rsync(
    answer: dict, side: str, key, source: str, target: str, home
) -> subprocess.CompletedProcess:
    """The rsync command line CLI 1.9.1 runs with the answer's address and port."""
    ssh_cmd = (
        f"ssh -i {key} -p {answer[f'{side}_port']} -o StrictHostKeyChecking=no "
        f"-o UserKnownHostsFile={home}/known_hosts"
    )
    return subprocess.run(
        ["rsync", "-arz", "-v", "--progress", "--rsh=ssh", "-e", ssh_cmd, source, target],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def run(client, instance_id: int, command: str) -> dict:
    done = client.put(
        f"/api/v0/instances/command/{instance_id}/", {"command": command}, format="json"
    )
    assert done.status_code == 200, done.content
    return done.json()


def test_files_go_into_and_out_of_an_instance_with_the_clis_rsync(
    funded_team, machine, ssh_image, tmp_path
):
    client = key_client(funded_team)
    key_path = tmp_path / "id_ed25519"
    make_key(key_path)
    public_key = (tmp_path / "id_ed25519.pub").read_text().strip()
    assert client.post("/api/v1/ssh-keys/", {"name": "laptop", "public_key": public_key},
                       format="json").status_code == 201  # fmt: skip
    body = rent(client, machine, image=ssh_image, launch_mode="ssh")
    assert body["state"] == "running", body["status_message"]
    host_key_of(client, body["id"])  # sshd is up
    marker = tmp_path / "owned"
    odd = f"a;b $(touch {marker}) `id` *"  # in '' in the renter's own commands
    up = tmp_path / "up"
    (up / odd).mkdir(parents=True)
    (up / odd / "f.txt").write_text("from the laptop\n")

    answer = client.put(
        "/api/v0/commands/rsync/",
        {"client_id": "me", "src_id": None, "dst_id": f"C.{body['id']}",
         "src_path": f"{up}/", "dst_path": "/workspace/in/"},
        format="json",
    )  # fmt: skip
    assert answer.status_code == 200, answer.content
    reply = answer.json()
    assert reply["success"] and reply["dst_addr"] == machine.address
    sent = cli_rsync(reply, "dst", key_path, f"{up}/",
                     f"vastai_kaalia@{reply['dst_addr']}::C.{body['id']}//workspace/in/", tmp_path)  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    assert run(client, body["id"], f"cat '/workspace/in/{odd}/f.txt'")["output"] == (
        "from the laptop\n"
    )

    out = client.put(  # as the CLI sends `copy C.<id>:… local:…` (copy_direct, "local")
        "/api/v0/commands/copy_direct/",
        {"client_id": "me", "src_id": str(body["id"]), "dst_id": "local",
         "src_path": "/workspace/in/", "dst_path": str(tmp_path / "down")},
        format="json",
    )  # fmt: skip
    assert out.status_code == 200, out.content
    reply = out.json()
    assert reply["src_port"] == answer.json()["dst_port"]
    got = cli_rsync(reply, "src", key_path,
                    f"vastai_kaalia@{reply['src_addr']}::{body['id']}//workspace/in/",
                    str(tmp_path / "down"), tmp_path)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "down" / odd / "f.txt").read_text() == "from the laptop\n"
    assert not marker.exists()
    assert run(client, body["id"], f"test -e {marker}")["exit_code"] == 1


def test_a_copy_between_two_instances_of_the_team(
    funded_team, provider_team, sim_host_factory, tmp_path
):
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    client = key_client(funded_team)
    sleeper = {"image": "gpumkt/busybox:latest", "entrypoint": "sleep", "args": ["600"]}
    source, target = rent(client, machine, **sleeper), rent(client, machine, **sleeper)
    marker = tmp_path / "owned"
    odd = f"/work dir/a;b $(touch {marker}) `id` *"  # in '' in the renter's own commands
    made = run(client, source["id"], f"mkdir -p '{odd}/sub' && echo one > '{odd}/sub/f' && "
               f"ln -s sub/f '{odd}/link'")  # fmt: skip
    assert made["exit_code"] == 0, made

    copied = client.put(
        "/api/v0/commands/copy_direct/",
        {"client_id": "me", "src_id": f"C.{source['id']}", "dst_id": str(target["id"]),
         "src_path": f"{odd}/", "dst_path": "/data/$(reboot)/"},
        format="json",
    )  # fmt: skip
    assert copied.status_code == 200 and copied.json()["success"], copied.content
    shown = run(client, target["id"], "cat '/data/$(reboot)/sub/f' '/data/$(reboot)/link'")
    assert shown["output"] == "one\none\n", shown
    # Without a trailing slash the directory itself goes in, as rsync does.
    whole = client.put(
        "/api/v0/commands/copy_direct/",
        {"src_id": source["id"], "dst_id": target["id"], "src_path": f"{odd}/sub",
         "dst_path": "/elsewhere"},
        format="json",
    )  # fmt: skip
    assert whole.status_code == 200, whole.content
    assert run(client, target["id"], "cat /elsewhere/sub/f")["output"] == "one\n"
    assert not marker.exists()

    missing = client.put(
        "/api/v0/commands/copy_direct/",
        {"src_id": source["id"], "dst_id": target["id"], "src_path": "/no/such",
         "dst_path": "/never"},
        format="json",
    )  # fmt: skip
    assert missing.status_code == 422 and "/no/such does not exist" in missing.json()["msg"]
    assert run(client, target["id"], "test -e /never")["exit_code"] == 1


def test_another_teams_instances_are_not_there_and_nothing_is_copied(
    funded_team, provider_team, sim_host_factory, ssh_image
):
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    other = TeamFactory(name="Other")
    add_member(other, UserFactory(), Role.OWNER)
    fund(other)
    theirs = rent(key_client(other), machine, image=ssh_image, launch_mode="ssh")
    client = key_client(funded_team)
    ours = rent(client, machine, image="gpumkt/busybox:latest", entrypoint="sleep", args=["600"])
    run(client, ours["id"], "mkdir -p /secret && echo mine > /secret/f")

    opened = client.put(
        "/api/v0/commands/rsync/",
        {"src_id": None, "dst_id": str(theirs["id"]), "src_path": "x", "dst_path": "/w/"},
        format="json",
    )
    assert opened.status_code == 404 and "not one of your team's" in opened.json()["msg"]
    into = client.put(
        "/api/v0/commands/copy_direct/",
        {"src_id": ours["id"], "dst_id": theirs["id"], "src_path": "/secret/", "dst_path": "/w/"},
        format="json",
    )
    out_of = client.put(
        "/api/v0/commands/copy_direct/",
        {"src_id": theirs["id"], "dst_id": ours["id"], "src_path": "/etc/", "dst_path": "/w/"},
        format="json",
    )
    assert into.status_code == 404 and out_of.status_code == 404
    looked = run(key_client(other), theirs["id"], "test -e /w || test -e /etc/rsyncd.conf")
    assert looked["exit_code"] == 1  # no module opened, nothing written
    assert run(client, ours["id"], "test -e /w")["exit_code"] == 1


def test_copy_requests_that_cannot_be_honoured_are_refused(funded_team, machine):
    client = key_client(funded_team)
    busybox = rent(client, machine, image="gpumkt/busybox:latest", entrypoint="sleep", args=["600"])
    here = str(busybox["id"])
    refusals = [
        ("rsync", {"src_id": None, "dst_id": None, "src_path": "a", "dst_path": "b"}, "src_id"),
        ("rsync", {"src_id": "V.3", "dst_id": None, "src_path": "/a", "dst_path": "b"}, "src_id"),
        ("rsync", {"src_id": None, "dst_id": "s3.101", "src_path": "a", "dst_path": "/b"}, "dst_id"),
        ("rsync", {"src_id": None, "dst_id": here, "src_path": "a", "dst_path": "rel"}, "dst_path"),
        ("rsync", {"src_id": None, "dst_id": here, "src_path": "a\nb", "dst_path": "/b"}, "src_path"),
        ("copy_direct", {"src_id": "local", "dst_id": None, "src_path": "/a", "dst_path": "/b"}, "src_id"),
        ("copy_direct", {"src_id": here, "dst_id": here, "src_path": ["/a"], "dst_path": "/b"}, "src_path"),
        ("copy_direct", {"src_id": "C.x", "dst_id": here, "src_path": "/a", "dst_path": "/b"}, "src_id"),
    ]  # fmt: skip
    for kind, body, field in refusals:
        answer = client.put(f"/api/v0/commands/{kind}/", body, format="json")
        assert answer.status_code == 400, (body, answer.content)
        assert field in answer.json()["error"]["fields"], (body, answer.json())
    no_ssh = client.put(
        "/api/v0/commands/rsync/",
        {"src_id": None, "dst_id": here, "src_path": "a", "dst_path": "/b"},
        format="json",
    )
    assert no_ssh.status_code == 409 and "rent with --ssh" in no_ssh.json()["msg"]
    assert run(client, busybox["id"], "test -e /etc/rsyncd.conf")["exit_code"] == 1
    cancel = client.delete("/api/v0/commands/copy_direct/", {"dst_id": here}, format="json")
    assert cancel.status_code == 400 and "none is in progress" in cancel.json()["msg"]
