"""The instance's WebSocket: its events only, its team only, and a real log follow of a
container that keeps printing (docker logs --follow over the machine's SSH)."""

from __future__ import annotations

import re
import subprocess

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from marketplace.asgi import application
from marketplace.rentals.actions import rental_stop_request
from scheduler.models import Instance
from tests.conftest import key_client
from tests.factories import UserFactory, add_member
from tests.marketplace.test_websocket import session_cookie_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

COUNTING = ["-c", "trap 'exit 0' TERM; i=0; while :; do echo line-$i; i=$((i+1)); sleep 0.2; done"]


def rent_counting(team, machine, args: list[str] = COUNTING) -> Instance:
    """A running rental of a container that runs ``args`` (by default: counts out loud)."""
    body = {
        "machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
        "duration_hours": 1, "entrypoint": "sh", "args": args,
    }  # fmt: skip
    response = key_client(team).post("/api/v1/instances/", body, format="json")
    assert response.status_code == 201, response.content
    instance = Instance.objects.get(pk=response.json()["id"])
    assert instance.state == "running", instance.status_message
    return instance


async def socket_for(user, team, instance_id: int) -> WebsocketCommunicator:
    cookie = await sync_to_async(session_cookie_for)(user, team.id if team else None)
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if user is not None:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, f"/ws/instances/{instance_id}/", headers=headers)


async def next_event(ws, name: str, timeout: float = 15) -> dict:
    """The next message of this kind (others in between are skipped)."""
    while True:
        message = await ws.receive_json_from(timeout=timeout)
        if message["event"] == name:
            return message["data"]


def numbers(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.fullmatch(r"line-(\d+)", line))]


async def test_only_the_instance_team_may_subscribe(funded_team, owner, outsider, machine):
    instance = await sync_to_async(rent_counting)(funded_team, machine)
    strangers = await socket_for(outsider, None, instance.pk)
    missing = await socket_for(owner, funded_team, instance.pk + 1000)
    for refused in (strangers, missing):  # alike: accepted, then closed with 4404
        assert (await refused.connect())[0]
        closed = await refused.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4404}
    anonymous = WebsocketCommunicator(
        application, f"/ws/instances/{instance.pk}/",
        headers=[(b"origin", b"http://testserver"), (b"host", b"testserver")],
    )  # fmt: skip
    assert (await anonymous.connect())[0] is False

    teammate = await sync_to_async(UserFactory)(username="mate")
    await sync_to_async(add_member)(funded_team, teammate)
    ws = await socket_for(teammate, funded_team, instance.pk)
    connected, _ = await ws.connect()
    assert connected
    assert await ws.receive_json_from(timeout=5) == {
        "event": "hello", "data": {"id": instance.pk, "state": "running"},
    }  # fmt: skip
    await ws.disconnect()


async def test_the_instance_group_gets_its_own_transitions_only(funded_team, owner, machine):
    instance = await sync_to_async(rent_counting)(funded_team, machine)
    other = await sync_to_async(rent_counting)(funded_team, machine)
    ws = await socket_for(owner, funded_team, instance.pk)
    assert (await ws.connect())[0]
    await next_event(ws, "hello")
    await sync_to_async(rental_stop_request)(instance=other)
    await sync_to_async(rental_stop_request)(instance=instance)
    states = [await next_event(ws, "instance.state"), await next_event(ws, "instance.state")]
    assert {state["id"] for state in states} == {instance.pk}  # never the other one's
    assert [(state["from"], state["state"]) for state in states] == [
        ("running", "stopping"),
        ("stopping", "stopped"),
    ]
    await ws.disconnect()


async def test_follow_streams_new_lines_as_the_container_writes_them(funded_team, owner, machine):
    instance = await sync_to_async(rent_counting)(funded_team, machine)
    ws = await socket_for(owner, funded_team, instance.pk)
    assert (await ws.connect())[0]
    await next_event(ws, "hello")
    await ws.send_json_to({"type": "follow", "tail": 3})
    first = numbers((await next_event(ws, "logs"))["lines"])
    assert 1 <= len(first) <= 3  # the tail asked for, then what comes after it
    seen = list(first)
    while len(seen) < len(first) + 10:
        seen += numbers((await next_event(ws, "logs"))["lines"])
    # Every line once, in order, none missing: a follow, not a repeated tail.
    assert seen == list(range(seen[0], seen[0] + len(seen)))

    await ws.send_json_to({"type": "unfollow"})
    await ws.send_json_to({"type": "ping"})
    await next_event(ws, "pong")  # the unfollow is done: nothing more comes from that follow
    await sync_to_async(subprocess.run)(
        ["docker", "stop", instance.container_id], capture_output=True, check=True
    )
    await ws.send_json_to({"type": "follow", "tail": 2})
    lines, message = [], await ws.receive_json_from(timeout=15)
    while message["event"] == "logs":
        lines += message["data"]["lines"]
        message = await ws.receive_json_from(timeout=15)
    assert message == {"event": "logs.end", "data": {"reason": "The container stopped."}}
    last_two = numbers(lines)
    assert len(last_two) == 2 and last_two[1] == last_two[0] + 1 and last_two[1] >= seen[-1]
    await ws.disconnect()


async def test_follow_before_the_container_exists_says_so(funded_team, owner, machine):
    instance = await sync_to_async(rent_counting)(funded_team, machine)
    await sync_to_async(Instance.objects.filter(pk=instance.pk).update)(
        state="launching", container_id=""
    )
    ws = await socket_for(owner, funded_team, instance.pk)
    assert (await ws.connect())[0]
    await next_event(ws, "hello")
    await ws.send_json_to({"type": "follow", "tail": 10})
    assert await next_event(ws, "logs.end") == {"reason": "The container has not started yet."}
    await ws.disconnect()
