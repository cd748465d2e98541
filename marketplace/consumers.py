"""WebSockets: the console's live feed of the acting team's events, and one instance's page
(its events and, on request, its container's log lines as they are written)."""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from marketplace.events import instance_group, team_group
from marketplace.log_follow import LogFollower
from marketplace.tenancy import ACTIVE_TEAM_SESSION_KEY, membership_for, team_objects
from scheduler.models import Instance, InstanceState

MAX_TAIL = 5000


async def _membership(consumer: AsyncJsonWebsocketConsumer):
    """The acting membership of the socket's user, or None (anonymous, or no team)."""
    user = consumer.scope.get("user")
    if user is None or not user.is_authenticated:
        return None, 4401
    session = consumer.scope.get("session")
    team_id = session.get(ACTIVE_TEAM_SESSION_KEY) if session is not None else None
    membership = await database_sync_to_async(membership_for)(user=user, team_id=team_id)
    return membership, 4403


class TeamEventsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        membership, refusal = await _membership(self)
        if membership is None:
            await self.close(code=refusal)  # closed before accept: the handshake is refused
            return
        self.group = team_group(membership.team_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"event": "hello", "data": {"team": membership.team_id}})

    async def disconnect(self, code: int) -> None:
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)

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


class InstanceConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/instances/<id>/``: the instance's events; ``{"type": "follow", "tail": N}`` streams
    its log (the last N lines, then each new one) until ``{"type": "unfollow"}``.

    Subscribing reads the instance, so it passes the page's tenancy gate: another team's
    instance is closed before accept (4404), exactly like a missing one.

    Sends ``hello``, ``instance.state`` / ``instance.progress``, ``logs`` (``lines``, and
    ``dropped`` when a slow reader lost some) and ``logs.end`` (``reason``).
    """

    async def connect(self) -> None:
        self.follower: LogFollower | None = None
        self.sender: asyncio.Task | None = None
        membership, refusal = await _membership(self)
        if membership is None:
            await self.close(code=refusal)
            return
        instance_id = self.scope["url_route"]["kwargs"]["instance_id"]
        instance = await database_sync_to_async(_team_instance)(membership.team, instance_id)
        if instance is None:
            await self.close(code=4404)
            return
        self.team, self.instance_id = membership.team, instance.pk
        self.group = instance_group(instance.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json(
            {"event": "hello", "data": {"id": instance.pk, "state": instance.state}}
        )

    async def disconnect(self, code: int) -> None:
        self._stop_following()
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "follow":
            try:
                tail = min(max(int(content.get("tail", 200)), 0), MAX_TAIL)
            except (TypeError, ValueError):
                tail = 200
            await self._follow(tail)
        elif kind == "unfollow":
            self._stop_following()
        elif kind == "ping":
            await self.send_json({"event": "pong", "data": {}})

    async def instance_event(self, message: dict) -> None:
        await self.send_json({"event": message["event"], "data": message["data"]})

    # --- log follow -----------------------------------------------------------------------

    async def _follow(self, tail: int) -> None:
        self._stop_following()
        # Read again: the container may have been made, or the instance moved, since connect.
        instance = await database_sync_to_async(_team_instance)(self.team, self.instance_id)
        if instance is None or not instance.container_id:
            await self._send_end("The container has not started yet.")
            return
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        follower = LogFollower(
            machine=instance.machine,
            container=instance.container_id,
            tail=tail,
            wake=lambda: loop.call_soon_threadsafe(ready.set),
        )
        self.follower = follower
        self.sender = asyncio.create_task(self._send_lines(follower, ready))
        follower.start()

    def _stop_following(self) -> None:
        if self.follower is not None:
            self.follower.stop()
            self.follower = None
        if self.sender is not None:
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
