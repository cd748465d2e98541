"""The per-process team feed (core/fanout.py) on a private Redis: one subscription per
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
from websockets.frames import Frame, Opcode

from core.fanout import CONNECTION_KEY, FanOut, ServerConnection, write_frame
from deploy.cluster import Redis
from marketplace.events import team_group

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
    feeds = [await hub.join(layer, team_group(1), browser) for browser in acme]
    await hub.join(layer, team_group(2), other)
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


class AppSocket:
    """The team feed's side of one socket: the ASGI send uvicorn gave it."""

    def __init__(self, send) -> None:
        self.base_send = send


async def feed_server(layer, hub: FanOut, connections: list):
    """uvicorn (its default ``websockets`` protocol, compression on offer) serving sockets that
    each join team 1's feed and, once their hello is out, let its frames go straight to their
    server connection, as the team feed's consumer does."""
    import uvicorn

    async def app(scope, receive, send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        socket, connection = AppSocket(send), scope[CONNECTION_KEY]
        connections.append(connection)
        feed = await hub.join(layer, team_group(1), socket)
        await send({"type": "websocket.send", "text": '{"event": "hello", "data": {}}'})
        feed.write_straight(socket, connection)
        try:
            while (await receive())["type"] != "websocket.disconnect":
                pass
        finally:
            hub.leave(feed, socket)

    config = uvicorn.Config(
        ServerConnection(app), host="127.0.0.1", port=0, ws="websockets", lifespan="off",
        log_level="warning",
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"ws://127.0.0.1:{port}/ws/events/"


# uvicorn's default WebSocket protocol is built on websockets' legacy (deprecated) one.
@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning:uvicorn.protocols.websockets.websockets_impl"
)
@pytest.mark.filterwarnings("ignore:websockets.legacy is deprecated")
@pytest.mark.filterwarnings("ignore:remove second argument of ws_handler")
async def test_browsers_get_the_same_json_text_frames_written_straight_or_sent(private_redis):
    """A browser that negotiated no compression gets the feed's frames written straight onto
    its connection; one that negotiated permessage-deflate gets them through uvicorn's send.
    Both read the same text frames with the same JSON, in order; a socket that closed is
    skipped without disturbing the others."""
    from websockets.asyncio.client import connect

    layer = RedisChannelLayer(hosts=[private_redis.url], prefix=PREFIX)
    hub, connections = FanOut(), []
    server, task, url = await feed_server(layer, hub, connections)
    try:
        plain = await connect(url, compression=None)
        deflate = await connect(url)  # a browser offers compression; uvicorn accepts it
        leaving = await connect(url, compression=None)
        for browser in (plain, deflate, leaving):
            assert json.loads(await browser.recv())["event"] == "hello"
        assert [bool(connection.extensions) for connection in connections] == [
            False,
            True,
            False,
        ]
        await leaving.close()

        for n in (1, 2, 3):
            await layer.group_send(team_group(1), team_event(n))
        expected = [{"event": "instance.state", "data": {"n": n}} for n in (1, 2, 3)]
        for browser in (plain, deflate):
            frames = [await asyncio.wait_for(browser.recv(), 10) for _ in expected]
            assert all(isinstance(frame, str) for frame in frames)  # text frames
            assert [json.loads(frame) for frame in frames] == expected

        # The straight write is taken only where it is the same as uvicorn's send.
        frame = Frame(Opcode.TEXT, b'{"event": "x", "data": {}}').serialize(mask=False)
        assert write_frame(connections[0], frame)
        assert json.loads(await asyncio.wait_for(plain.recv(), 10)) == {"event": "x", "data": {}}
        assert not write_frame(connections[1], frame)  # compressed: bytes differ per socket
        assert not write_frame(connections[2], frame)  # closed
        assert not write_frame(object(), frame)  # not uvicorn's websockets protocol
        await plain.close()
        await deflate.close()
    finally:
        server.should_exit = True
        await task
