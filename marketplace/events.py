"""Live events to the console: published to Channels groups after the transaction commits.

Groups: ``team.<id>`` for everything a team's console shows, ``instance.<id>`` for one
instance's page (its state, progress, and the log socket that lives there), and ``user.<id>``
for a user's sockets, told when the user loses access to a team or the account. Consumers join
only after the tenancy check (the acting team's group; an instance of the acting team), so an
event never reaches another team.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


def team_group(team_id: int) -> str:
    return f"team.{team_id}"


def instance_group(instance_id: int) -> str:
    return f"instance.{instance_id}"


def user_group(user_id: int) -> str:
    """Every socket of one user: told when the user loses access."""
    return f"user.{user_id}"


def _send_on_commit(messages: list[tuple[str, dict[str, Any]]], what: str) -> None:
    """Send on commit; a rolled-back change never reaches a browser."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(_send_all)(layer, messages, what)

    transaction.on_commit(send)


async def _send_all(layer, messages: list[tuple[str, dict[str, Any]]], what: str) -> None:
    """Every message in one trip to the event loop (a batch of placements sends thousands),
    groups side by side so their round trips to Redis overlap; each group's messages in
    order."""
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for group, message in messages:
        by_group[group].append(message)
    lanes = asyncio.Semaphore(SEND_LANES)

    async def send_group(group: str, group_messages: list[dict[str, Any]]) -> None:
        async with lanes:
            for message in group_messages:
                try:
                    await layer.group_send(group, message)
                except Exception:  # a push is best-effort; the page reloads state on reconnect
                    logger.exception("could not publish %s to %s", what, group)

    await asyncio.gather(*(send_group(group, queue) for group, queue in by_group.items()))


# Groups sent to at once: enough to hide Redis round trips, few enough not to open a
# connection storm.
SEND_LANES = 32


def publish_team_event(team_id: int, event_type: str, data: dict[str, Any]) -> None:
    publish_team_events(event_type, [(team_id, data)])


def publish_team_events(event_type: str, events: list[tuple[int, dict[str, Any]]]) -> None:
    """Many teams' events of one type, (team id, data) each, sent together."""
    messages = [
        (team_group(team_id), {"type": "team.event", "event": event_type, "data": data})
        for team_id, data in events
    ]
    _send_on_commit(messages, event_type)


def publish_instance_event(
    team_id: int, instance_id: int, event_type: str, data: dict[str, Any]
) -> None:
    """To the team's consoles (lists, overview) and to the instance's own page."""
    _send_on_commit(
        [
            (team_group(team_id), {"type": "team.event", "event": event_type, "data": data}),
            (
                instance_group(instance_id),
                {"type": "instance.event", "event": event_type, "data": data},
            ),
        ],
        event_type,
    )


def publish_access_lost(user_id: int, team_id: int | None) -> None:
    """The user is no longer in the team (``None``: lost the account): every socket of theirs
    serving that team closes."""
    message = {"type": "access.lost", "team_id": team_id}
    _send_on_commit([(user_group(user_id), message)], "access.lost")
