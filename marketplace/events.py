"""Live events to the console: published to Channels groups after the transaction commits.

Groups: ``team.<id>`` for everything a team's console shows; consumers subscribe to the
acting team's group only, so an event never reaches another team.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


def team_group(team_id: int) -> str:
    return f"team.{team_id}"


def publish_team_event(team_id: int, event_type: str, data: dict[str, Any]) -> None:
    """Send on commit; a rolled-back change never reaches a browser."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(
                team_group(team_id), {"type": "team.event", "event": event_type, "data": data}
            )
        except Exception:  # a push is best-effort; the page reloads state on reconnect
            logger.exception("could not publish %s to team %s", event_type, team_id)

    transaction.on_commit(send)
