"""SSH mode in Chromium: the instance list says "Starting sshd" while the container makes its
host keys, and shows *running* only once sshd answers, so the renter's first ssh is not
refused (it showed *running* about 2 s before sshd listened).

The image is the SSH test image whose ``ssh-keygen`` waits for a file the test writes into the
container, so the wait for sshd lasts exactly until the page was seen showing it: no race with
the clock. The rent goes to the live server over HTTP, as a renter's script would, so its
launch runs in the real worker and the page learns of each step through its WebSocket. (Rented
through the test's in-process client, the launch ran eagerly inside that call, and the phase
was over before the test looked at the page: why this test failed in most runs.)"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.request

import pytest

from marketplace.models import ApiKey, Membership, Role
from marketplace.services.accounts import api_key_create
from scheduler.models import Instance, InstanceState, PortAllocation
from tests.browser.test_rent_flow import log_in
from tests.marketplace.conftest import fund, machine_for

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]

HELD_KEYS_IMAGE = "gpumkt/sshbox-held-keys:test"
GO_FILE = "/tmp/start-sshd"
# Ahead of the real ssh-keygen in the image's PATH: waits until the test says go.
HELD_KEYGEN = (
    f'#!/bin/sh\nwhile [ ! -e {GO_FILE} ]; do sleep 0.1; done\nexec /usr/bin/ssh-keygen "$@"\n'
)


def held_keys_image(tmp_path) -> str:
    """The SSH image with an ``ssh-keygen`` that makes the keys only once GO_FILE exists."""
    from hosts.devtools.sim_docker import ensure_ssh_image

    base = ensure_ssh_image()
    script = tmp_path / "ssh-keygen"
    script.write_text(HELD_KEYGEN)
    script.chmod(0o755)
    made = subprocess.run(
        ["docker", "create", base], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        subprocess.run(
            ["docker", "cp", str(script), f"{made}:/usr/sbin/ssh-keygen"], check=True,
            capture_output=True,
        )  # fmt: skip
        subprocess.run(["docker", "commit", made, HELD_KEYS_IMAGE], check=True, capture_output=True)
    finally:
        subprocess.run(["docker", "rm", "-f", made], capture_output=True, check=False)
    return HELD_KEYS_IMAGE


def rent_over_http(live_server_url: str, team, body: dict) -> dict:
    """POST /api/v1/instances/ to the live server with an API key: the launch is the worker's."""
    owner = Membership.objects.get(team=team, role=Role.OWNER)
    secret = api_key_create(
        membership=owner, name="ssh-starting", access=ApiKey.Access.WRITE
    ).secret
    request = urllib.request.Request(
        f"{live_server_url}/api/v1/instances/",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 201
        return json.load(response)


def test_ssh_mode_says_starting_sshd_until_sshd_answers(
    page, live_server_url, celery_worker, team, owner, sim_host_factory, provider_team, tmp_path
):
    from playwright.sync_api import expect

    image = held_keys_image(tmp_path)
    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    fund(team)
    log_in(page, live_server_url, owner, team)
    page.goto(f"{live_server_url}/instances/")
    expect(page.locator("#live-dot")).to_have_class(re.compile("on"))

    body = {
        "machine_id": machine.pk, "num_gpus": 1, "duration_hours": 1, "ports": [],
        "image": image, "launch_mode": "ssh",
    }  # fmt: skip
    rented = rent_over_http(live_server_url, team, body)
    row = page.locator(f'#instances-table tr[data-instance="{rented["id"]}"]')
    # While the launch waits on sshd, the row says so and is not running.
    expect(row).to_contain_text("Starting sshd", timeout=90_000)
    expect(row.locator(".badge.state")).to_have_attribute("data-state", "launching")
    instance = Instance.objects.get(pk=rented["id"])
    assert instance.state == InstanceState.LAUNCHING

    subprocess.run(
        ["docker", "exec", instance.container_name, "touch", GO_FILE], check=True,
        capture_output=True,
    )  # fmt: skip
    expect(row.locator(".badge.state")).to_have_attribute("data-state", "running", timeout=60_000)
    expect(row).not_to_contain_text("Starting sshd")

    port = PortAllocation.objects.get(instance_id=rented["id"], container_port=22)
    with socket.create_connection((machine.address, port.host_port), timeout=5) as connection:
        connection.settimeout(5)
        assert connection.recv(64).startswith(b"SSH-2.0-")
