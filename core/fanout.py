"""One subscription per web process to each group, fanned out to that process's sockets.

Why it exists: a team event used to reach every console socket through channels'
per-consumer path: the group held one channel per socket, so ``group_send`` stored one message
per socket in Redis, each web process popped them one at a time (a Redis round trip and the
receive lock's task juggling per socket), and each socket's consumer task woke to encode the
same JSON again.
With 500 sockets a process, that was most of the event's way to the last browser
(bench/websocket_fanout.py; figures in docs/benchmarks.md).

Here a process joins a group once, with one channel of its own, while it has at least one
socket of that group's feed; an event is popped once, encoded once, and the same frame is
written to each of the process's sockets of that group. Who may join which group is the
caller's check (marketplace's consumers add a socket only after its membership check, and
remove it the moment it loses access or closes), so a socket only ever receives its own
group's events.

A feed relays a group message that has an ``event`` and its ``data`` as the text frame
``{"event": …, "data": …}``; other messages are not for browsers and are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from channels.layers import BaseChannelLayer
from websockets.frames import Frame, Opcode

logger = logging.getLogger(__name__)

# channels_redis forgets a group's members after ``group_expiry`` (a day by default); a feed
# lives as long as its process has sockets in the group, so it joins again well before.
REJOIN_SECONDS = 3600.0
# What a socket is closed with when its feed fails: 1011, the server hit an unexpected error.
CLOSE_FAILED = {"type": "websocket.close", "code": 1011}


class FeedSocket(Protocol):
    """What a feed writes to: the consumer's raw ASGI send."""

    async def base_send(self, message: dict[str, Any]) -> None: ...


# ASGI's callables, as ``ServerConnection`` passes them on.
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Feed:
    """The process's subscription to one group and the process's sockets in it."""

    def __init__(
        self, layer: BaseChannelLayer, group: str, on_failure: Callable[[Feed], None]
    ) -> None:
        self.layer, self.group = layer, group
        self.on_failure = on_failure
        # Each socket with its server connection once frames may go straight to it
        # (``write_straight``), else None; ordered, so sockets get frames in join order.
        self.sockets: dict[FeedSocket, Any] = {}
        # Sockets with frames still on their way through the normal send, and how many.
        self.sending: dict[FeedSocket, int] = {}
        self.subscribed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.channel: str | None = None
        self.task = asyncio.create_task(self._run(), name=f"feed {group}")
        self.writes: set[asyncio.Task[None]] = set()

    async def _run(self) -> None:
        rejoin = None
        try:
            # The layer's default prefix: this process's sockets' channels share one Redis list
            # and one receive lock with it, so whoever holds the lock pops the feed's messages
            # too (another prefix would wait behind each socket's blocking pop).
            self.channel = await self.layer.new_channel()
            await self.layer.group_add(self.group, self.channel)
            self.subscribed.set_result(None)
            rejoin = asyncio.create_task(self._rejoin())
            while True:
                self.deliver(await self.layer.receive(self.channel))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if not self.subscribed.done():
                self.subscribed.set_exception(error)
            logger.exception("the feed of %s stopped", self.group)
            self._fail()
        finally:
            if not self.subscribed.done():
                self.subscribed.cancel()
            if rejoin is not None:
                rejoin.cancel()
            if self.channel is not None:
                # Leaving must happen even though this task is being cancelled.
                asyncio.get_running_loop().create_task(self._discard(self.channel))

    def _fail(self) -> None:
        """The layer failed (Redis gone): close the feed's sockets, as a consumer whose own
        receive failed would have been. Browsers reconnect, fetch what they missed, and join
        a new feed."""
        self.on_failure(self)
        for socket in list(self.sockets):
            self._send(socket, CLOSE_FAILED)

    async def _rejoin(self) -> None:
        while True:
            await asyncio.sleep(REJOIN_SECONDS)
            try:
                await self.layer.group_add(self.group, self.channel)
            except Exception:  # tried again next time, well within the group's expiry
                logger.warning("could not rejoin %s", self.group, exc_info=True)

    async def _discard(self, channel: str) -> None:
        try:
            await self.layer.group_discard(self.group, channel)
        except Exception:  # the group expires by itself; nothing reaches a closed feed anyway
            logger.warning("could not leave %s", self.group, exc_info=True)

    def write_straight(self, socket: FeedSocket, connection: Any) -> None:
        """From now on ``socket``'s frames may be written straight onto ``connection`` (the
        server's, see ``write_frame``). Called once the socket's own first frame (its hello)
        has gone out, so no feed frame overtakes it."""
        if socket in self.sockets:
            self.sockets[socket] = connection

    def deliver(self, message: dict[str, Any]) -> None:
        """Encode once; write the same frame to every socket of the group in this process.

        A server's text frame is unmasked, so it is the same bytes for every socket that did
        not negotiate compression: those get them straight onto their connection
        (``write_frame``), with no task and no per-socket encoding. The others (compressed,
        not served by uvicorn's ``websockets`` protocol, behind on reading, or with an
        earlier frame still on its way) take the normal ASGI send."""
        if "event" not in message or "data" not in message:
            return
        text = json.dumps({"event": message["event"], "data": message["data"]})
        frame = {"type": "websocket.send", "text": text}
        encoded = Frame(Opcode.TEXT, text.encode()).serialize(mask=False)
        for socket, connection in list(self.sockets.items()):
            if connection is None or socket in self.sending or not write_frame(connection, encoded):
                self._send(socket, frame)

    def _send(self, socket: FeedSocket, frame: dict[str, Any]) -> None:
        """The normal send, in its own task so that one slow browser (its send waiting for
        the socket to drain) holds up nobody else; the frame itself is written before the
        task first waits, so each socket still gets events in order."""
        self.sending[socket] = self.sending.get(socket, 0) + 1
        task = asyncio.get_running_loop().create_task(_write(socket, frame))
        self.writes.add(task)
        task.add_done_callback(lambda task: self._sent(task, socket))

    def _sent(self, task: asyncio.Task[None], socket: FeedSocket) -> None:
        self.writes.discard(task)
        left = self.sending.pop(socket, 1) - 1
        if left:
            self.sending[socket] = left

    def stop(self) -> None:
        self.task.cancel()


# A connection with more than this waiting to go out (a browser not reading) gets its frames
# through the normal send, which waits for it to drain, instead of growing its buffer further.
MAX_BUFFERED = 64 * 1024

# The scope key under which ``ServerConnection`` leaves the socket's server connection.
CONNECTION_KEY = "gpumkt.server_connection"


class ServerConnection:
    """ASGI middleware: remembers in the scope the object whose ``send`` the server gave the
    socket (uvicorn's connection), for ``write_frame``. Changes nothing else."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connection = getattr(send, "__self__", None)
        await self.app({**scope, CONNECTION_KEY: connection}, receive, send)


def write_frame(connection: Any, encoded: bytes) -> bool:
    """Write an encoded, unmasked, uncompressed frame straight to a socket's transport, as
    the protocol's own ``send`` would (``write_frame_sync``: the frame onto the transport)
    minus its per-message work; False (nothing written) when the socket must take the normal
    send instead.

    This reaches past ASGI into uvicorn's connection (websockets' legacy protocol: ``state``,
    ``extensions``, ``transfer_data_task``, ``transport``), so it writes only when that is
    plainly the same as ``send``: an open connection of that protocol that negotiated no
    extension (compression would make the bytes differ per socket) and whose buffer is not
    backed up (``send`` would wait for it to drain). uvicorn sends no fragmented messages,
    so a frame never lands inside another message."""
    # uvicorn's default WebSocket protocol (``--ws websockets``) is websockets' legacy one;
    # looked up rather than imported (importing it warns that it is deprecated): a process
    # that has not loaded it has no such connection.
    legacy = sys.modules.get("websockets.legacy.protocol")
    if legacy is None or not isinstance(connection, legacy.WebSocketCommonProtocol):
        return False
    if connection.state is not legacy.State.OPEN or connection.extensions or connection.is_client:
        return False
    if connection.transfer_data_task.done():  # closing without a handshake: let send raise
        return False
    transport = connection.transport
    if transport is None or transport.is_closing():
        return False
    if transport.get_write_buffer_size() > MAX_BUFFERED:
        return False
    transport.write(encoded)
    return True


async def _write(socket: FeedSocket, frame: dict[str, Any]) -> None:
    # A socket closed meanwhile refuses the write; its consumer leaves the feed as it closes.
    with contextlib.suppress(Exception):
        await socket.base_send(frame)


class FanOut:
    """The feeds of one event loop (one per web process; tests run several loops)."""

    def __init__(self) -> None:
        self.feeds: dict[str, Feed] = {}

    async def join(self, layer: BaseChannelLayer, group: str, socket: FeedSocket) -> Feed:
        """Add ``socket`` to the group's feed; returns the feed once the process listens on the
        group, so anything sent after this reaches the socket."""
        feed = self.feeds.get(group)
        if feed is None:
            feed = self.feeds[group] = Feed(layer, group, self._forget)
        feed.sockets[socket] = None
        try:
            await asyncio.shield(feed.subscribed)
        except BaseException:
            self.leave(feed, socket)
            raise
        return feed

    def leave(self, feed: Feed, socket: FeedSocket) -> None:
        """Remove ``socket`` from ``feed``: nothing more is written to it. The last one out
        stops the feed."""
        feed.sockets.pop(socket, None)
        if not feed.sockets:
            self._forget(feed)
            feed.stop()

    def _forget(self, feed: Feed) -> None:
        if self.feeds.get(feed.group) is feed:
            del self.feeds[feed.group]


_fan_outs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FanOut] = (
    weakref.WeakKeyDictionary()
)


def fan_out() -> FanOut:
    """This event loop's fan-out."""
    loop = asyncio.get_running_loop()
    hub = _fan_outs.get(loop)
    if hub is None:
        hub = _fan_outs[loop] = FanOut()
    return hub
