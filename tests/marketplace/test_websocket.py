"""The live feed: closed before accept unless the user is logged in and the origin is ours."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from marketplace.asgi import application
from marketplace.events import publish_team_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def session_cookie_for(user, team_id=None) -> str:
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    if team_id:
        session["active_team_id"] = team_id
    session.save()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"


def communicator(origin: str = "http://testserver", cookie: str | None = None):
    headers = [(b"origin", origin.encode()), (b"host", b"testserver")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, "/ws/events/", headers=headers)


async def test_anonymous_websocket_is_closed_before_accept():
    connected, code = await communicator().connect()
    assert connected is False
    assert code == 4401


async def test_foreign_origin_is_closed_before_accept(owner, team):
    from asgiref.sync import sync_to_async

    cookie = await sync_to_async(session_cookie_for)(owner, team.id)
    connected, _ = await communicator(origin="https://evil.example", cookie=cookie).connect()
    assert connected is False


async def test_member_receives_own_team_events_only(owner, team, outsider):
    from asgiref.sync import sync_to_async

    cookie = await sync_to_async(session_cookie_for)(owner, team.id)
    ws = communicator(cookie=cookie)
    connected, _ = await ws.connect()
    assert connected
    hello = await ws.receive_json_from(timeout=5)
    assert hello == {"event": "hello", "data": {"team": team.id}}

    outsider_team = await sync_to_async(lambda: outsider.teams.get().id)()
    await sync_to_async(publish_team_event)(outsider_team, "instance.updated", {"id": 1})
    await sync_to_async(publish_team_event)(team.id, "instance.updated", {"id": 2})
    message = await ws.receive_json_from(timeout=5)
    assert message == {"event": "instance.updated", "data": {"id": 2}}
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_the_team_feed_reaches_each_member_and_stops_at_a_removed_one(
    owner, teammate, team, outsider
):
    """A process hears a team's group once and writes each event to every socket of that team
    it serves (marketplace/fanout.py): each gets every event once, in order; a member removed
    from the team is closed out and gets nothing more, while the others go on; another team's
    socket in the same process gets none of it."""
    from asgiref.sync import sync_to_async

    from marketplace.models import Membership, Role
    from marketplace.services.accounts import membership_remove

    def remove_teammate() -> None:
        membership_remove(
            actor=Membership.objects.get(team=team, role=Role.OWNER),
            target=Membership.objects.get(team=team, user=teammate),
        )

    outsider_team = await sync_to_async(lambda: outsider.teams.get().id)()
    sockets = {}
    for name, user, team_id in [
        ("owner", owner, team.id),
        ("owner again", owner, team.id),
        ("teammate", teammate, team.id),
        ("outsider", outsider, outsider_team),
    ]:
        sockets[name] = communicator(cookie=await sync_to_async(session_cookie_for)(user, team_id))
        assert (await sockets[name].connect())[0]
        assert (await sockets[name].receive_json_from(timeout=5))["event"] == "hello"

    for n in (1, 2):
        await sync_to_async(publish_team_event)(team.id, "instance.updated", {"n": n})
    for name in ("owner", "owner again", "teammate"):
        for n in (1, 2):
            message = await sockets[name].receive_json_from(timeout=5)
            assert message == {"event": "instance.updated", "data": {"n": n}}
        assert await sockets[name].receive_nothing(timeout=0.2)

    await sync_to_async(remove_teammate)()
    closed = await sockets["teammate"].receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4403}
    await sync_to_async(publish_team_event)(team.id, "instance.updated", {"n": 3})
    for name in ("owner", "owner again"):
        message = await sockets[name].receive_json_from(timeout=5)
        assert message == {"event": "instance.updated", "data": {"n": 3}}
    assert await sockets["teammate"].receive_nothing(timeout=0.3)
    assert await sockets["outsider"].receive_nothing(timeout=0.1)
    for ws in sockets.values():
        await ws.disconnect()


def instance_socket(cookie: str, instance_id: int) -> WebsocketCommunicator:
    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"cookie", cookie.encode()),
    ]
    return WebsocketCommunicator(application, f"/ws/instances/{instance_id}/", headers=headers)


async def test_instance_socket_is_refused_for_another_teams_instance(teammate, team, outsider):
    """The outsider cannot subscribe to Acme's instance, whichever team is active; the teammate
    can. (No container is needed: the refusal comes before anything is read from a host.)"""
    from asgiref.sync import sync_to_async

    from hosts.models import Machine
    from scheduler.models import Instance

    def rented_instance() -> Instance:
        # Rows only: a transactional test would run the launch task of a real rental.
        machine = Machine.objects.create(
            team=team, name="acme-rig", address="192.0.2.40", port=22, status="online"
        )
        return Instance.objects.create(team=team, machine=machine, gpu_count=1, image="x")

    instance = await sync_to_async(rented_instance)()
    for active in (None, team.id):  # their own team, or a smuggled-in id of Acme's
        cookie = await sync_to_async(session_cookie_for)(outsider, active)
        refused = instance_socket(cookie, instance.pk)
        assert (await refused.connect())[0]  # accepted, so the page sees the code
        closed = await refused.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4404}
    cookie = await sync_to_async(session_cookie_for)(teammate, team.id)
    ws = instance_socket(cookie, instance.pk)
    connected, _ = await ws.connect()
    assert connected
    hello = await ws.receive_json_from(timeout=5)
    assert hello == {"event": "hello", "data": {"id": instance.pk, "state": "launching"}}
    await ws.disconnect()
