"""The ``vastai`` SDK (``VastAI(api_key, server_url)``, 1.9.1, pinned) drives this marketplace
unchanged: search → a template and a volume → create from the template with the volume → wait
→ ssh-url → ssh in with a key added by attach ssh → copy a file in and out → execute → destroy.

The SDK runs in the CLI's own virtualenv (tests/vast/cli.py), so each call is one short
subprocess there that prints the SDK's answer as JSON; the test reads it as a script would.
``copy`` answers where the user's own rsync goes (the SDK runs none): the test then runs the
rsync command line the CLI runs with that answer.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from hosts.devtools.sim_docker import ensure_ssh_image
from tests.marketplace.test_launch_modes import login, make_key
from tests.vast.cli import ensure_cli
from tests.vast.test_cli_conformance import key_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

DRIVER = """
import json, sys
from vastai import VastAI
sdk = VastAI(api_key=sys.argv[1], server_url=sys.argv[2], retry=1)
print("SDK-ANSWER " + json.dumps(eval(sys.argv[3], {"sdk": sdk})))
"""


class Sdk:
    def __init__(self, url: str, api_key: str, home):
        self.python = ensure_cli().parent / "python"
        self.url, self.api_key, self.home = url, api_key, home

    def __call__(self, expression: str):
        """``expression`` on ``sdk`` (the VastAI object), its answer as JSON."""
        done = subprocess.run(
            [str(self.python), "-c", DRIVER, self.api_key, self.url, expression],
            capture_output=True, text=True, timeout=180,
            env={"PATH": "/usr/bin:/bin", "HOME": str(self.home),
                 "VASTAI_NO_UPDATE_CHECK": "1", "LANG": "C.UTF-8"},
        )  # fmt: skip
        answer = [line for line in done.stdout.splitlines() if line.startswith("SDK-ANSWER ")]
        assert done.returncode == 0 and answer, (expression, done.stdout, done.stderr)
        return json.loads(answer[-1].removeprefix("SDK-ANSWER "))


def rsync(*, key, port: int, home, source: str, target: str) -> None:
    """The rsync command line CLI 1.9.1's ``copy`` runs (vastai/cli/commands/storage.py)."""
    ssh_cmd = (
        f"ssh -i {key} -p {port} -o StrictHostKeyChecking=no "
        f"-o UserKnownHostsFile={home}/known_hosts"
    )
    done = subprocess.run(
        ["rsync", "-arz", "-v", "--progress", "--rsh=ssh", "-e", ssh_cmd, source, target],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_vastai_sdk_drives_a_rental_from_search_to_destroy(
    live_server_url, celery_worker, funded_team, machine, tmp_path
):
    sdk = Sdk(live_server_url, key_for(funded_team), tmp_path)
    image = ensure_ssh_image()
    offers = sdk(f"sdk.search_offers(query='machine_id={machine.pk} num_gpus=1')")
    assert [offer["machine_id"] for offer in offers] == [machine.pk]
    offer = offers[0]["id"]

    template = sdk(f"sdk.create_template(name='sshbox', image={image!r}, ssh=True, disk_space=8)")
    hash_id = template["template"]["hash_id"]
    volumes = sdk(f"sdk.search_volumes(query='machine_id={machine.pk}')")
    assert [v["id"] for v in volumes] == [machine.pk] and volumes[0]["disk_space"] >= 1
    volume = sdk(f"sdk.create_volume(id={machine.pk}, size=1, name='work')")["volume_id"]

    made = sdk(
        f"sdk.create_instance(id={offer}, template_hash={hash_id!r}, link_volume={volume}, "
        "mount_path='/work')"
    )
    assert made["success"], made
    instance = made["new_contract"]
    try:
        deadline, shown = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            shown = sdk(f"sdk.show_instance(id={instance})")
            if shown["actual_status"] == "running":
                break
            time.sleep(1)
        assert shown["actual_status"] == "running", shown
        assert shown["image_uuid"] == image and shown["image_runtype"] == "ssh"
        assert volume in [v["id"] for v in sdk("sdk.show_volumes()") if instance in v["instances"]]

        url = sdk(f"sdk.ssh_url(id={instance})")
        assert url == f"ssh://root@{machine.address}:{shown['ssh_port']}"
        key = make_key(tmp_path / "id_sdk")
        public_key = (tmp_path / "id_sdk.pub").read_text().strip()
        attached = sdk(f"sdk.attach_ssh(instance_id={instance}, ssh_key={public_key!r})")
        assert attached["success"], attached
        read_key = f"sdk.execute(id={instance}, command='cat /etc/ssh/ssh_host_ed25519_key.pub')"
        deadline, host_key = time.monotonic() + 30, sdk(read_key)
        while host_key["exit_code"] != 0 and time.monotonic() < deadline:  # sshd makes it
            time.sleep(0.5)
            host_key = sdk(read_key)
        session = login(machine.address, shown["ssh_port"], key, host_key["output"].strip())
        try:
            _, stdout, _ = session.exec_command(
                "echo over-ssh > /work/from-ssh; cat /work/from-ssh"
            )
            assert stdout.read().decode().strip() == "over-ssh"
        finally:
            session.close()
        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "from-laptop").write_text("copied in\n")
        into = sdk(f"sdk.copy(src='local:{tmp_path}/up/', dst='C.{instance}:/work/in/')")
        assert into["success"] and into["dst_port"] == shown["ssh_port"], into
        rsync(key=tmp_path / "id_sdk", port=into["dst_port"], home=tmp_path,
              source=f"{tmp_path}/up/",
              target=f"vastai_kaalia@{into['dst_addr']}::C.{instance}//work/in/")  # fmt: skip
        out = sdk(f"sdk.copy(src='C.{instance}:/work/', dst='local:{tmp_path}/down')")
        rsync(key=tmp_path / "id_sdk", port=out["src_port"], home=tmp_path,
              source=f"vastai_kaalia@{out['src_addr']}::C.{instance}//work/",
              target=f"{tmp_path}/down")  # fmt: skip
        assert (tmp_path / "down" / "from-ssh").read_text() == "over-ssh\n"
        assert (tmp_path / "down" / "in" / "from-laptop").read_text() == "copied in\n"
        ran = sdk(f"sdk.execute(id={instance}, command='cat /work/from-ssh /work/in/from-laptop')")
        assert ran["output"] == "over-ssh\ncopied in\n" and ran["exit_code"] == 0
    finally:
        gone = sdk(f"sdk.destroy_instance(id={instance})")
    assert gone["success"], gone
    deleted = sdk(f"sdk.delete_volume(id={volume})")
    assert deleted["success"], deleted
