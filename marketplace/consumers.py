"""WebSockets: the console's live feed of the acting team's events, and one instance's page
(its events and, on request, its container's log lines as they are written).

Access is checked at connect, and again while the socket lives: every socket also listens on
its user's group, where the loss of a membership (removed, left, the team or the user deleted)
or of the account (deactivated) is announced the moment it commits, and a follow request
re-reads the membership. A user no longer in the team is closed out at once (4404 on an
instance's socket, like another team's instance; 4403 on the team feed), with no query per
event relayed.

Refusals: an anonymous socket is closed before accept (the handshake fails); a signed-in user
without the team (4403) or the instance (4404: another team's and a missing one alike) is
accepted and closed at once with that code, so the page can tell a refusal from a network
failure and stop retrying (static/js). A path no route serves is closed the same way (4404).

Frames: text of at most ``MAX_FRAME_CHARS``, a JSON object. A larger one closes the socket
(1009, "message too big"); one that is not a JSON object is ignored. Neither logs a traceback.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from core.fanout import CONNECTION_KEY, Feed, fan_out
from marketplace.api.fields import clamped_whole
from marketplace.api.parsers import json_body
from marketplace.events import instance_group, team_group, user_group
from marketplace.log_follow import LogFollower, TooManyFollowers
from marketplace.models import Membership
from marketplace.tenancy import ACTIVE_TEAM_SESSION_KEY, membership_for, team_objects
from scheduler.models import Instance, InstanceState

MAX_TAIL = 5000
# The console sends small commands ({"type": "follow", "tail": 200}); nothing needs more.
MAX_FRAME_CHARS = 4096
MESSAGE_TOO_BIG = 1009
# A socket may ask to follow this many times per window; past that it is told to wait.
FOLLOW_BURST, FOLLOW_WINDOW_SECONDS = 5, 30.0
# A socket runs one follower, plus at most one earlier one still letting go of its stream.
FOLLOWER_THREADS_PER_SOCKET = 2


async def _membership(consumer: AsyncJsonWebsocketConsumer):
    """The acting membership of the socket's user, or None (anonymous, or no team)."""
    user = consumer.scope.get("user")
    if user is None or not user.is_authenticated:
        return None, 4401
    session = consumer.scope.get("session")
    team_id = session.get(ACTIVE_TEAM_SESSION_KEY) if session is not None else None
    membership = await database_sync_to_async(membership_for)(user=user, team_id=team_id)
    return membership, 4403


def _is_member(user, team_id: int) -> bool:
    return user.is_active and Membership.objects.filter(user=user, team_id=team_id).exists()


# Messages relayed from the channel layer whose handlers touch no database.
RELAYED_MESSAGES = frozenset({"team.event", "instance.event", "access.lost"})


async def refuse(consumer: AsyncJsonWebsocketConsumer, code: int) -> None:
    """Close with ``code``: before accept for an anonymous socket (4401: the handshake fails),
    else accepted first so the browser sees the code (a refused handshake reads as a network
    failure to it, and the page would retry forever)."""
    if code != 4401:
        await consumer.accept()
    await consumer.close(code=code)


class _JsonCommands(AsyncJsonWebsocketConsumer):
    """Frames are small JSON objects: a larger frame closes the socket, any other is ignored
    (``receive_json`` is handed dicts only)."""

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        frame = text_data if text_data is not None else bytes_data
        if frame is None:
            return
        if len(frame) > MAX_FRAME_CHARS:
            await self.close(code=MESSAGE_TOO_BIG)
            return
        try:
            content = json_body(frame, max_depth=8)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(content, dict):
            await self.receive_json(content, **kwargs)


class NoSuchSocket(AsyncJsonWebsocketConsumer):
    """Any WebSocket path no route serves (``/ws/nope/``, ``/ws/instances/abc/``): closed with
    4404, as a missing instance is, instead of the router's "No route found" error."""

    async def connect(self) -> None:
        await refuse(self, 4404)


class _MemberSocket(_JsonCommands):
    """A socket that serves one team's member, and closes once the user loses access."""

    removed_code = 4403
    team_id: int
    joined: tuple[str, ...] = ()

    async def dispatch(self, message: dict) -> None:
        """Relayed events go straight to their handler. Channels' own dispatch first hops to
        a worker thread to close stale database connections, for every message: with 500
        sockets in a process receiving one team event, those hops, queued one after another,
        were most of the event's way to the last browser (bench/websocket_fanout.py; figures
        in docs/benchmarks.md). These handlers read no database; those
        that do go through ``database_sync_to_async``, which closes stale connections itself.
        """
        if message.get("type") in RELAYED_MESSAGES:
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)

    async def _join(self, team_id: int, group: str | None) -> bool:
        """Listen on ``group`` (if any) and on the user's own group, then accept (False:
        refused)."""
        self.team_id = team_id
        user = user_group(self.scope["user"].pk)
        self.joined = (group, user) if group else (user,)
        for name in self.joined:
            await self.channel_layer.group_add(name, self.channel_name)
        # Once more now that a loss of access would be heard: one that committed between the
        # first check and joining would otherwise go unnoticed.
        if not await database_sync_to_async(_is_member)(self.scope["user"], team_id):
            await self._leave()
            await refuse(self, self.removed_code)
            return False
        await self.accept()
        return True

    async def _leave(self) -> None:
        joined, self.joined = self.joined, ()
        for name in joined:
            await self.channel_layer.group_discard(name, self.channel_name)

    async def disconnect(self, code: int) -> None:
        await self._leave()

    async def access_lost(self, message: dict) -> None:
        """The user left this team (or lost the account): close the socket now."""
        if message.get("team_id") in (None, self.team_id):
            await self._removed()

    async def _still_member(self) -> bool:
        """Re-read the membership (before starting work for the user); close if gone."""
        member = await database_sync_to_async(_is_member)(self.scope["user"], self.team_id)
        if not member:
            await self._removed()
        return member

    async def _removed(self) -> None:
        if not self.joined:
            return  # already closed out
        await self._leave()
        await self.close(code=self.removed_code)


class TeamEventsConsumer(_MemberSocket):
    """``/ws/events/``: the acting team's events. The team's group is heard once per process
    (core/fanout.py), which writes each event's frame to this socket; the socket's own
    channel hears only its user's group (a loss of access closes it)."""

    feed: Feed | None = None

    async def connect(self) -> None:
        membership, refusal = await _membership(self)
        if membership is None:
            await refuse(self, refusal)
            return
        if await self._join(membership.team_id, None):
            # Added to the feed only once accepted (a frame may not precede the accept), and
            # before the hello: every event sent after the hello reaches the socket.
            self.feed = await fan_out().join(
                self.channel_layer, team_group(membership.team_id), self
            )
            await self.send_json({"event": "hello", "data": {"team": membership.team_id}})
            if self.feed is not None:  # still open
                self.feed.write_straight(self, self.scope.get(CONNECTION_KEY))

    async def _leave(self) -> None:
        feed, self.feed = self.feed, None
        if feed is not None:
            fan_out().leave(feed, self)  # nothing more is written to this socket
        await super()._leave()

    async def receive_json(self, content, **kwargs) -> None:
        if content.get("type") == "ping":
            await self.send_json({"event": "pong", "data": {}})

    async def team_event(self, message: dict) -> None:
        await self.send_json({"event": message["event"], "data": message["data"]})


def _team_instance(team, instance_id: int) -> Instance | None:
    """The instance if it is the team's (the same gate as the instance page), else None."""
    return (
        team_objects(team, Instance.objects.select_related("machine"))
        .exclude(state=InstanceState.DESTROYED)
        .filter(pk=instance_id)
        .first()
    )


class InstanceConsumer(_MemberSocket):
    """``/ws/instances/<id>/``: the instance's events; ``{"type": "follow", "tail": N}`` streams
    its log (the last N lines, then each new one) until ``{"type": "unfollow"}``.

    Subscribing reads the instance, so it passes the page's tenancy gate: another team's
    instance is accepted and closed at once with 4404, exactly like a missing one; so is a
    user who has left the team since.

    A socket has one follower at a time (a new follow replaces it), asks at most
    ``FOLLOW_BURST`` times per ``FOLLOW_WINDOW_SECONDS``, and is refused (``logs.end`` with the
    reason) while its previous follower is still letting go or the machine's followers in this
    process are at their cap.

    Sends ``hello``, ``instance.state`` / ``instance.progress``, ``logs`` (``lines``, and
    ``dropped`` when a slow reader lost some) and ``logs.end`` (``reason``).
    """

    removed_code = 4404

    async def connect(self) -> None:
        self.follower: LogFollower | None = None
        self.sender: asyncio.Task | None = None
        self.threads: list[LogFollower] = []  # this socket's followers, stopping ones included
        self.follow_times: deque[float] = deque(maxlen=FOLLOW_BURST)
        membership, refusal = await _membership(self)
        if membership is None:
            await refuse(self, refusal)
            return
        instance_id = self.scope["url_route"]["kwargs"]["instance_id"]
        instance = await database_sync_to_async(_team_instance)(membership.team, instance_id)
        if instance is None:
            await refuse(self, 4404)  # another team's or a missing one: the same answer
            return
        self.team, self.instance_id = membership.team, instance.pk
        if await self._join(membership.team_id, instance_group(instance.pk)):
            await self.send_json(
                {"event": "hello", "data": {"id": instance.pk, "state": instance.state}}
            )

    async def disconnect(self, code: int) -> None:
        self._stop_following()
        await super().disconnect(code)

    async def receive_json(self, content, **kwargs) -> None:
        kind = content.get("type")
        if kind == "follow":
            try:
                tail = clamped_whole(content.get("tail", 200), 0, MAX_TAIL)
            except ValueError:  # not a number (1e309 included): the default
                tail = 200
            await self._follow(tail)
        elif kind == "unfollow":
            self._stop_following()
        elif kind == "ping":
            await self.send_json({"event": "pong", "data": {}})

    async def instance_event(self, message: dict) -> None:
        await self.send_json({"event": message["event"], "data": message["data"]})

    async def _removed(self) -> None:
        self._stop_following()
        await super()._removed()

    # --- log follow -----------------------------------------------------------------------

    async def _follow(self, tail: int) -> None:
        if not self.joined:
            return  # closed out already
        now = time.monotonic()
        if (
            len(self.follow_times) == FOLLOW_BURST
            and now - self.follow_times[0] < FOLLOW_WINDOW_SECONDS
        ):
            # Refused before anything changes: the stream already open goes on.
            await self._send_end("Too many follow requests; wait a few seconds and try again.")
            return
        self.follow_times.append(now)
        self._stop_following()  # a new follow replaces the old one, whatever comes of it
        if not await self._still_member():
            return
        # Read again: the container may have been made, or the instance moved, since connect.
        instance = await database_sync_to_async(_team_instance)(self.team, self.instance_id)
        if instance is None or not instance.container_id:
            await self._send_end("The container has not started yet.")
            return
        self.threads = [thread for thread in self.threads if thread.is_alive()]
        if len(self.threads) >= FOLLOWER_THREADS_PER_SOCKET:
            await self._send_end(
                "The previous log stream is still closing; try again in a few seconds."
            )
            return
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        follower = LogFollower(
            machine=instance.machine,
            container=instance.container_id,
            tail=tail,
            wake=lambda: loop.call_soon_threadsafe(ready.set),
        )
        try:
            follower.start()
        except TooManyFollowers as refusal:
            await self._send_end(f"Too many followers: {refusal}")
            return
        self.threads.append(follower)
        self.follower = follower
        self.sender = asyncio.create_task(self._send_lines(follower, ready))

    def _stop_following(self) -> None:
        if self.follower is not None:
            self.follower.stop()
            self.follower = None
        if self.sender is not None:
            if self.sender is not asyncio.current_task():  # the sender may be closing us out
                self.sender.cancel()
            self.sender = None

    async def _send_lines(self, follower: LogFollower, ready: asyncio.Event) -> None:
        """Batch what the thread collected into one message per wake-up."""
        while True:
            await ready.wait()
            ready.clear()
            # The end is set after the last line is buffered: read it first, so a take()
            # made after seeing it has every line.
            ended = follower.end_reason
            lines, dropped = follower.take()
            if lines:
                data: dict[str, object] = {"lines": lines}
                if dropped:
                    data["dropped"] = dropped
                await self.send_json({"event": "logs", "data": data})
            if ended is not None:
                await self._send_end(ended)
                if self.follower is follower:
                    self.follower, self.sender = None, None
                return

    async def _send_end(self, reason: str) -> None:
        await self.send_json({"event": "logs.end", "data": {"reason": reason}})
