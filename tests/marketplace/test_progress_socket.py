"""An image pull's progress reaching the browser over its WebSockets: a renter rents an image the
host lacks (served by a registry on loopback, so Docker really downloads and extracts a layer)
and the open socket shows the pull step by step, then the instance running."""

from __future__ import annotations

import subprocess

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from marketplace.asgi import application
from marketplace.tasks import rental_launch
from scheduler.models import Instance
from tests.conftest import key_client
from tests.marketplace.conftest import docker_inspect
from tests.marketplace.registry import Registry
from tests.marketplace.test_websocket import session_cookie_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

BASE_IMAGE = "gpumkt/busybox:latest"
QUICK_STOP = ["-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]


def rent(team, machine, image: str) -> Instance:
    body = {
        "machine_id": machine.pk, "num_gpus": 1, "image": image, "duration_hours": 1,
        "disk_gb": 10, "entrypoint": "sh", "args": QUICK_STOP,
    }  # fmt: skip
    response = key_client(team).post("/api/v1/instances/", body, format="json")
    assert response.status_code == 201, response.content
    return Instance.objects.get(pk=response.json()["id"])


async def socket(user, team, path: str) -> WebsocketCommunicator:
    cookie = await sync_to_async(session_cookie_for)(user, team.id)
    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"cookie", cookie.encode()),
    ]
    ws = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await ws.connect()
    assert connected, code
    return ws


async def until_running(ws, instance_id: int) -> list[dict]:
    """This instance's messages, in the order the socket delivered them, up to the state
    change that leaves ``launching``."""
    seen = []
    while True:
        message = await ws.receive_json_from(timeout=30)
        if message["data"].get("id") != instance_id:
            continue
        seen.append(message)
        if message["event"] == "instance.state" and message["data"]["state"] != "launching":
            return seen


def check_pull_reports(progress: list[dict], instance_id: int) -> None:
    """What the console draws as its progress bar: a pull that goes forward, then the start."""
    assert all(p["id"] == instance_id for p in progress)
    steps = [(p["progress"], p["message"]) for p in progress]
    assert steps, "no instance.progress reached the socket"
    assert steps[0] == (5, "Pulling image"), steps
    assert (90, "Pulling image: 1/1 layers") in steps, steps
    assert steps[-1] == (92, "Starting container"), steps
    percents = [p for p, _ in steps]
    assert percents == sorted(percents), steps  # never goes back
    assert all(5 <= p <= 92 for p in percents)
    assert all(m.startswith("Pulling image") for _, m in steps[:-1]), steps


async def test_the_team_feed_shows_the_pull_then_running(funded_team, owner, machine):
    registry = await sync_to_async(Registry)(BASE_IMAGE)
    try:
        ws = await socket(owner, funded_team, "/ws/events/")
        assert await ws.receive_json_from(timeout=5) == {
            "event": "hello", "data": {"team": funded_team.id},
        }  # fmt: skip
        # The launch runs inside the rent (eager tasks); the socket is open all along.
        instance = await sync_to_async(rent)(funded_team, machine, registry.image)
        messages = await until_running(ws, instance.pk)
        await ws.disconnect()
        pulled = await sync_to_async(docker_inspect)(instance.container_id)
    finally:
        await sync_to_async(registry.close)()

    kinds = [m["event"] for m in messages]
    assert messages[0] == {
        "event": "instance.state",
        "data": {"id": instance.pk, "state": "launching", "from": "", "reason": "Rented"},
    }
    assert messages[-1] == {
        "event": "instance.state",
        "data": {
            "id": instance.pk, "state": "running", "from": "launching",
            "reason": "Container started",
        },
    }  # fmt: skip
    # Everything in between is the pull's progress, and there is some.
    assert set(kinds[1:-1]) == {"instance.progress"}, kinds
    check_pull_reports([m["data"] for m in messages[1:-1]], instance.pk)
    # It really was pulled from the registry, and the instance says what the socket said.
    assert pulled["Config"]["Image"] == registry.image
    assert (instance.state, instance.progress) == ("running", 100)


async def test_the_instance_page_socket_shows_a_pull_a_worker_starts_later(
    funded_team, owner, machine
):
    """The renter's instance page is open while the launch is still queued (no worker has
    taken it yet); the worker then pulls the image, and the page's own socket sees it all."""
    registry = await sync_to_async(Registry)(BASE_IMAGE)
    try:
        instance = await sync_to_async(rent)(funded_team, machine, registry.image)
        assert instance.state == "running", instance.status_message

        def back_to_a_queued_launch() -> None:
            # No container and no image on the host: the worker must pull again.
            subprocess.run(["docker", "rm", "-f", instance.container_id], check=True,
                           capture_output=True)  # fmt: skip
            subprocess.run(["docker", "image", "rm", registry.image], check=True,
                           capture_output=True)  # fmt: skip
            Instance.objects.filter(pk=instance.pk).update(
                state="launching", container_id="", attempts=0, progress=0
            )

        await sync_to_async(back_to_a_queued_launch)()
        ws = await socket(owner, funded_team, f"/ws/instances/{instance.pk}/")
        assert await ws.receive_json_from(timeout=5) == {
            "event": "hello", "data": {"id": instance.pk, "state": "launching"},
        }  # fmt: skip
        assert await sync_to_async(rental_launch.delay)(instance.pk) is not None
        messages = await until_running(ws, instance.pk)
        assert await ws.receive_nothing(timeout=0.3)  # nothing after running
        await ws.disconnect()
        # (database_sync_to_async closes its connection, so the test database can be dropped.)
        relaunched = await database_sync_to_async(Instance.objects.get)(pk=instance.pk)
        pulled = await sync_to_async(docker_inspect)(relaunched.container_id)
    finally:
        await sync_to_async(registry.close)()

    assert [m["event"] for m in messages[:-1]] == ["instance.progress"] * (len(messages) - 1)
    check_pull_reports([m["data"] for m in messages[:-1]], instance.pk)
    assert messages[-1]["data"] == {
        "id": instance.pk, "state": "running", "from": "launching", "reason": "Container started",
    }  # fmt: skip
    assert pulled["Config"]["Image"] == registry.image and pulled["State"]["Running"]
    assert (relaunched.state, relaunched.progress) == ("running", 100)
