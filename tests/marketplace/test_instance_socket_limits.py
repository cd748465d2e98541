"""The instance socket's bounds, on real containers followed over the simulated host's SSH: one
follower per socket (plus at most one still letting go), a rate of follow requests, a cap of
followers per machine in the process that leaves a stream session free and answers at once;
and the user's membership checked again while a socket lives."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import sync_to_async

from hosts.runtime import DockerHost
from marketplace import consumers
from marketplace.log_follow import MAX_FOLLOWERS_PER_MACHINE, LogFollower, followers_on
from marketplace.models import Membership, Role
from marketplace.services.accounts import membership_remove
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.test_instance_socket import COUNTING, next_event, rent_counting, socket_for
from tests.marketplace.test_websocket import communicator, session_cookie_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

QUIET = ["-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]  # prints nothing
TOO_MANY_REQUESTS = "Too many follow requests; wait a few seconds and try again."


def follower_threads(container_id: str) -> list[LogFollower]:
    return [
        thread
        for thread in threading.enumerate()
        if isinstance(thread, LogFollower) and thread.container == container_id
    ]


async def wait_until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


async def until_pong(ws) -> list[dict]:
    """Every message sent before the answer to a ping (so all earlier requests are handled)."""
    await ws.send_json_to({"type": "ping"})
    seen = []
    while (message := await ws.receive_json_from(timeout=15))["event"] != "pong":
        seen.append(message)
    return seen


async def close_code(ws, timeout: float = 15) -> int:
    """Skip what is still queued; the code the server closed the socket with."""
    while True:
        output = await ws.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return output["code"]


async def test_a_stopped_follower_lets_go_at_once_even_of_a_quiet_container(
    funded_team, owner, machine
):
    """A quiet container gives a follower's read nothing to return: stopping it closes the
    channel, so repeated follows never pile up threads holding the machine's sessions."""
    instance = await sync_to_async(rent_counting)(funded_team, machine, QUIET)
    ws = await socket_for(owner, funded_team, instance.pk)
    assert (await ws.connect())[0]
    await next_event(ws, "hello")
    for _ in range(4):
        await ws.send_json_to({"type": "follow", "tail": 10})
        await asyncio.sleep(0.3)  # each follower is in its stream before the next follow
    seen = await until_pong(ws)
    assert not [m for m in seen if m["event"] == "logs.end"]  # none refused, none ended
    await wait_until(lambda: len(follower_threads(instance.container_id)) == 1, timeout=5)
    assert followers_on(machine.pk) == 1

    await ws.send_json_to({"type": "unfollow"})
    await wait_until(lambda: not follower_threads(instance.container_id), timeout=5)
    assert followers_on(machine.pk) == 0  # well before the 20 s idle timeout
    await ws.disconnect()


async def test_follow_requests_are_rate_limited_per_socket(
    funded_team, owner, machine, monkeypatch
):
    instance = await sync_to_async(rent_counting)(funded_team, machine, COUNTING)
    ws = await socket_for(owner, funded_team, instance.pk)
    assert (await ws.connect())[0]
    await next_event(ws, "hello")
    for _ in range(consumers.FOLLOW_BURST):
        await ws.send_json_to({"type": "follow", "tail": 1})
        await next_event(ws, "logs")
        await ws.send_json_to({"type": "unfollow"})
        await wait_until(lambda: not follower_threads(instance.container_id))
    await ws.send_json_to({"type": "follow", "tail": 1})
    assert await next_event(ws, "logs.end") == {"reason": TOO_MANY_REQUESTS}
    assert not follower_threads(instance.container_id)  # nothing was started for it

    monkeypatch.setattr(consumers, "FOLLOW_WINDOW_SECONDS", 0.0)  # the window has passed
    await ws.send_json_to({"type": "follow", "tail": 1})
    assert numbers_of(await next_event(ws, "logs"))
    await ws.disconnect()


def numbers_of(data: dict) -> list[str]:
    return [line for line in data["lines"] if line.startswith("line-")]


async def test_followers_per_machine_are_capped_and_the_next_is_told_at_once(
    funded_team, owner, machine
):
    instance = await sync_to_async(rent_counting)(funded_team, machine, COUNTING)
    sockets = []
    for _ in range(MAX_FOLLOWERS_PER_MACHINE + 1):
        ws = await socket_for(owner, funded_team, instance.pk)
        assert (await ws.connect())[0]
        await next_event(ws, "hello")
        sockets.append(ws)
    *following, last = sockets
    for ws in following:
        await ws.send_json_to({"type": "follow", "tail": 1})
        await next_event(ws, "logs")
    assert followers_on(machine.pk) == MAX_FOLLOWERS_PER_MACHINE

    started = time.monotonic()
    await last.send_json_to({"type": "follow", "tail": 1})
    refused = await next_event(last, "logs.end", timeout=5)
    assert time.monotonic() - started < 5  # told, not left waiting for a session
    assert refused["reason"] == (
        f"Too many followers: {MAX_FOLLOWERS_PER_MACHINE} log streams are already open on this "
        "machine; use the tail view or try again shortly."
    )

    def one_line_on_a_stream_session() -> str:
        # What a pull in this process would need: a stream session is still free.
        stream = DockerHost(machine).logs_follow(instance.container_id, tail=1, timeout=10)
        try:
            return next(iter(stream))
        finally:
            stream.close()

    assert (await sync_to_async(one_line_on_a_stream_session)()).startswith("line-")

    await following[0].send_json_to({"type": "unfollow"})
    await wait_until(lambda: followers_on(machine.pk) < MAX_FOLLOWERS_PER_MACHINE)
    await last.send_json_to({"type": "follow", "tail": 1})
    assert numbers_of(await next_event(last, "logs"))  # a freed place is taken again
    for ws in sockets:
        await ws.disconnect()


def _remove(team, user) -> None:
    actor = Membership.objects.get(team=team, role=Role.OWNER)
    membership_remove(actor=actor, target=Membership.objects.get(team=team, user=user))


async def a_teammate_following(team, machine):
    """A running rental, and a teammate's instance socket following its log."""
    instance = await sync_to_async(rent_counting)(team, machine)
    mate = await sync_to_async(UserFactory)(username="mate")
    await sync_to_async(add_member)(team, mate)
    ws = await socket_for(mate, team, instance.pk)
    assert (await ws.connect())[0]
    await next_event(ws, "hello")
    await ws.send_json_to({"type": "follow", "tail": 1})
    await next_event(ws, "logs")
    return instance, mate, ws


async def test_a_removed_member_cannot_follow_again(funded_team, owner, machine):
    instance, mate, ws = await a_teammate_following(funded_team, machine)

    await sync_to_async(_remove)(funded_team, mate)
    await ws.send_json_to({"type": "follow", "tail": 1})
    assert await close_code(ws) == 4404  # as for another team's instance
    await wait_until(lambda: not follower_threads(instance.container_id))
    await ws.disconnect()


async def test_a_removed_members_open_sockets_close_at_once(funded_team, owner, machine):
    instance, mate, ws = await a_teammate_following(funded_team, machine)
    cookie = await sync_to_async(session_cookie_for)(mate, funded_team.id)
    feed = communicator(cookie=cookie)
    assert (await feed.connect())[0]
    assert (await feed.receive_json_from(timeout=5))["event"] == "hello"

    await sync_to_async(_remove)(funded_team, mate)
    # Told the moment the removal commits: no event or request of theirs is needed.
    assert await close_code(ws, timeout=5) == 4404
    assert await close_code(feed, timeout=5) == 4403
    await wait_until(lambda: not follower_threads(instance.container_id))
    await feed.disconnect()
    await ws.disconnect()


async def test_leaving_another_team_or_losing_the_account(funded_team, owner, machine):
    """Only the sockets of the team the user left close; a deactivated account closes all."""
    instance, mate, ws = await a_teammate_following(funded_team, machine)
    elsewhere = await sync_to_async(TeamFactory)(name="Elsewhere")
    await sync_to_async(add_member)(elsewhere, owner, Role.OWNER)
    await sync_to_async(add_member)(elsewhere, mate)
    await sync_to_async(_remove)(elsewhere, mate)
    assert (await ws.receive_json_from(timeout=5))["event"] == "logs"  # still following

    mate.is_active = False
    await sync_to_async(mate.save)(update_fields=["is_active"])
    assert await close_code(ws, timeout=5) == 4404
    await wait_until(lambda: not follower_threads(instance.container_id))
    await ws.disconnect()
