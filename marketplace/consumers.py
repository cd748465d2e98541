"""WebSocket: the console's live feed of the acting team's events."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from marketplace.events import team_group
from marketplace.tenancy import ACTIVE_TEAM_SESSION_KEY, membership_for


class TeamEventsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)  # closed before accept: the handshake is refused
            return
        session = self.scope.get("session")
        team_id = session.get(ACTIVE_TEAM_SESSION_KEY) if session is not None else None
        membership = await database_sync_to_async(membership_for)(user=user, team_id=team_id)
        if membership is None:
            await self.close(code=4403)
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
