"""Live events to the console: which groups there are and what their messages say. They are
sent after the transaction commits, by the process's publisher (``core.events``).

Groups: ``team.<id>`` for everything a team's console shows, ``instance.<id>`` for one
instance's page (its state, progress, and the log socket that lives there), and ``user.<id>``
for a user's sockets, told when the user loses access to a team or the account. Consumers join
only after the tenancy check (the acting team's group; an instance of the acting team), so an
event never reaches another team.
"""

from __future__ import annotations

from typing import Any

from channels.layers import get_channel_layer

from core.events import send_on_commit


def team_group(team_id: int) -> str:
    return f"team.{team_id}"


def instance_group(instance_id: int) -> str:
    return f"instance.{instance_id}"


def user_group(user_id: int) -> str:
    """Every socket of one user: told when the user loses access."""
    return f"user.{user_id}"


def teams_listened(team_ids: list[int]) -> list[int]:
    """Those of the teams whose console someone has open now (all of them where the layer
    cannot tell): for an event whose data costs a query to make."""
    layer = get_channel_layer()
    if layer is None:  # nothing is sent without a layer
        return []
    look = getattr(layer, "groups_listened_now", None)
    if look is None:
        return list(team_ids)
    listened = look([team_group(team_id) for team_id in team_ids])
    return [team_id for team_id in team_ids if team_group(team_id) in listened]


def publish_team_event(team_id: int, event_type: str, data: dict[str, Any]) -> None:
    publish_team_events(event_type, [(team_id, data)])


def publish_team_events(event_type: str, events: list[tuple[int, dict[str, Any]]]) -> None:
    """Many teams' events of one type, (team id, data) each, sent together."""
    messages = [
        (team_group(team_id), {"type": "team.event", "event": event_type, "data": data})
        for team_id, data in events
    ]
    send_on_commit(messages, event_type)


def publish_instance_event(
    team_id: int, instance_id: int, event_type: str, data: dict[str, Any]
) -> None:
    """To the team's consoles (lists, overview) and to the instance's own page."""
    send_on_commit(
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
    # Waited for: the change that took the access answers once the sockets were told.
    send_on_commit([(user_group(user_id), message)], "access.lost", wait=True)
