"""The per-process team feed (marketplace/fanout.py) on a private Redis: one subscription per
team in a process however many of its sockets watch it, each event written once to each of
that team's sockets and to no other team's; and when Redis goes away, the sockets are closed
(1011, so the console reconnects and fetches what it missed) instead of staying open and deaf.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
from channels_redis.core import RedisChannelLayer

from deploy.cluster import Redis
from marketplace.events import team_group
from marketplace.fanout import FanOut

pytestmark = pytest.mark.asyncio

PREFIX = "feedtest"


class Browser:
    """Stands in for one socket's ASGI send (uvicorn's): what would go on the wire to it."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def base_send(self, message: dict) -> None:
        self.sent.append(message)


@pytest.fixture
def private_redis(tmp_path):
    server = Redis(tmp_path / "redis", persistent=False).start()
    yield server
    server.stop()


async def until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


def team_event(n: int) -> dict:
    return {"type": "team.event", "event": "instance.state", "data": {"n": n}}


async def test_one_subscription_per_team_and_sockets_closed_when_redis_goes(private_redis):
    layer = RedisChannelLayer(hosts=[private_redis.url], prefix=PREFIX)
    hub = FanOut()
    acme = [Browser() for _ in range(3)]
    other = Browser()
    feeds = [await hub.join(layer, 1, browser) for browser in acme]
    await hub.join(layer, 2, other)
    assert feeds[0] is feeds[1] is feeds[2]
    groups = redis.Redis.from_url(private_redis.url)
    assert groups.zcard(f"{PREFIX}:group:{team_group(1)}") == 1  # one member, three sockets

    for n in (1, 2):
        await layer.group_send(team_group(1), team_event(n))
    await until(lambda: all(len(browser.sent) == 2 for browser in acme))
    for browser in acme:
        assert [json.loads(frame["text"]) for frame in browser.sent] == [
            {"event": "instance.state", "data": {"n": 1}},
            {"event": "instance.state", "data": {"n": 2}},
        ]
        assert {frame["type"] for frame in browser.sent} == {"websocket.send"}
    assert other.sent == []

    hub.leave(feeds[0], acme[0])
    await layer.group_send(team_group(1), team_event(3))
    await until(lambda: len(acme[1].sent) == 3 and len(acme[2].sent) == 3)
    assert len(acme[0].sent) == 2  # left: nothing more written to it

    private_redis.stop()
    closed = {"type": "websocket.close", "code": 1011}
    await until(lambda: all(b.sent[-1] == closed for b in [*acme[1:], other]))
    assert acme[0].sent[-1] != closed
    assert hub.feeds == {}  # the next socket of either team starts a new subscription
    groups.close()
