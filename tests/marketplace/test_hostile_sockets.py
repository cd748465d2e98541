"""Hostile WebSocket handshakes and frames (issue 30 §3, §5): each is refused cleanly (a refused
handshake, or a close with the code the README documents), nothing is written, and no traceback
reaches any log.

- An Origin other than the socket's own scheme, host and port is refused at the handshake.
- Another team's instance and a missing one answer alike: accepted, then closed with 4404, so
  the console sees the code and stops retrying (static/js/instance.js).
- A path no route serves closes with 4404, not the router's "No route found" error.
- A frame over 4096 characters closes with 1009; one that is not a JSON object is ignored.
"""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.apps import apps

from marketplace.asgi import application
from tests.marketplace.test_websocket import session_cookie_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

APPS_THAT_HOLD_STATE = ("marketplace", "scheduler", "hosts", "billing")


def row_counts() -> dict[str, int]:
    return {
        model._meta.label: model.objects.count()
        for label in APPS_THAT_HOLD_STATE
        for model in apps.get_app_config(label).get_models()
    }


def socket(path: str, cookie: str | None, origin: str = "http://testserver", **scope):
    headers = [(b"origin", origin.encode()), (b"host", b"testserver")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    ws = WebsocketCommunicator(application, path, headers=headers)
    ws.scope.update(scope)
    return ws


async def close_code(ws, timeout: float = 5) -> int:
    while True:
        output = await ws.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return output["code"]


def tracebacks(caplog) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()[:200]}"
        for r in caplog.records
        if r.levelno >= logging.ERROR or r.exc_info
    ]


def team_instance(team) -> int:
    """An instance of the team (rows only: nothing launches)."""
    from hosts.models import Machine
    from scheduler.models import Instance

    machine = Machine.objects.create(
        team=team, name="acme-rig", address="192.0.2.40", port=22, status="online"
    )
    return Instance.objects.create(team=team, machine=machine, gpu_count=1, image="x").pk


async def test_foreign_origins_are_refused_at_the_handshake(owner, team, caplog):
    """The origin must be the socket's own: scheme, host and port (the issue's three got in)."""
    caplog.set_level(logging.WARNING)
    cookie = await sync_to_async(session_cookie_for)(owner, team.id)
    assert (await socket("/ws/events/", cookie).connect())[0]  # our own page
    foreign = [
        "http://testserver:9999",  # anything else listening on the machine
        "http://testserver:8000",
        "https://testserver",  # another scheme
        "http://localhost",
        "http://127.0.0.1",
        "http://evil.example",
        "http://testserver.evil.example",
        "http://evil.example/testserver",
        "ws://testserver",
        "null",
        "",
        "testserver",
        "http://testserver:abc",
        "http://testserver:99999",
        "http://[::1",
        "http://user@evil.example",
    ]
    for origin in foreign:
        connected, _ = await socket("/ws/events/", cookie, origin=origin).connect()
        assert connected is False, origin
    behind_tls = socket("/ws/events/", cookie, origin="https://testserver", scheme="wss")
    assert (await behind_tls.connect())[0]  # wss at the server: the page was https
    assert tracebacks(caplog) == []


async def test_trusted_origins_are_compared_whole(owner, team, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.com", "https://*.corp.example"]
    cookie = await sync_to_async(session_cookie_for)(owner, team.id)
    for origin, allowed in [
        ("https://console.example.com", True),
        ("https://console.example.com:443", True),
        ("http://console.example.com", False),
        ("https://console.example.com:8443", False),
        ("https://a.corp.example", True),
        ("http://a.corp.example", False),
        ("https://corp.example.evil", False),
    ]:
        connected, _ = await socket("/ws/events/", cookie, origin=origin).connect()
        assert connected is allowed, origin


async def test_another_teams_instance_and_a_missing_one_close_alike_with_4404(
    owner, team, outsider, caplog
):
    caplog.set_level(logging.WARNING)
    instance_id = await sync_to_async(team_instance)(team)
    outsiders_team = await sync_to_async(lambda: outsider.teams.get().id)()
    stranger = await sync_to_async(session_cookie_for)(outsider, outsiders_team)
    member = await sync_to_async(session_cookie_for)(owner, team.id)
    for cookie, path in [
        (stranger, f"/ws/instances/{instance_id}/"),  # another team's
        (member, f"/ws/instances/{instance_id + 1000}/"),  # missing
        (member, "/ws/instances/0/"),
        (member, f"/ws/instances/{2**63}/"),  # past what the database holds
        (member, f"/ws/instances/{10**30}/"),
        (member, "/ws/instances/abc/"),
        (member, "/ws/instances/-1/"),
        (member, "/ws/instances/1.5/"),
        (member, "/ws/instances/"),
        (member, "/ws/nope/"),
        (member, "/ws/"),
        (member, "/ws/events/extra/"),
        (member, "/"),
        (member, "/ws/instances/%00/"),
        (None, "/ws/nope/"),
    ]:
        ws = socket(path, cookie)
        before = await sync_to_async(row_counts)()
        connected, _ = await ws.connect()
        assert connected, path  # accepted so the code reaches the page
        assert await close_code(ws) == 4404, path
        assert await sync_to_async(row_counts)() == before, path
    ours = socket(f"/ws/instances/{instance_id}/", member)
    assert (await ours.connect())[0]
    assert (await ours.receive_json_from(timeout=5))["event"] == "hello"
    await ours.disconnect()
    assert tracebacks(caplog) == []


async def test_no_team_closes_with_4403_after_accept(outsider, caplog):
    """A signed-in user whose active team is not theirs: the feed is refused with its code."""
    from marketplace.models import Membership

    await sync_to_async(lambda: Membership.objects.filter(user=outsider).delete())()
    cookie = await sync_to_async(session_cookie_for)(outsider, None)
    ws = socket("/ws/events/", cookie)
    assert (await ws.connect())[0]
    assert await close_code(ws) == 4403


async def test_hostile_frames_are_ignored_or_refused_without_a_traceback(owner, team, caplog):
    caplog.set_level(logging.WARNING)
    instance_id = await sync_to_async(team_instance)(team)
    cookie = await sync_to_async(session_cookie_for)(owner, team.id)
    ignored = [
        "not json",
        "[1, 2]",
        "null",
        '"text"',
        "1e309",
        "NaN",
        '{"type": {"a": 1}}',
        '{"type": ["follow"]}',
        '{"type": "follow", "tail": 1e309}',
        '{"type": "follow", "tail": "NaN"}',
        '{"type": "follow", "tail": [1]}',
        '{"type": "follow", "tail": -5}',
        '{"type": "unknown"}',
        "[" * 1000 + "]" * 1000,
        '{"a":' * 500 + "1" + "}" * 500,
        "\ud800",
    ]
    too_big = [
        "x" * 5_000_000,
        "[" * 10_000 + "]" * 10_000,
        '{"type": "ping", "p": "%s"}' % ("x" * 5000),
    ]
    for path in ("/ws/events/", f"/ws/instances/{instance_id}/"):
        before = await sync_to_async(row_counts)()
        ws = socket(path, cookie)
        assert (await ws.connect())[0]
        assert (await ws.receive_json_from(timeout=5))["event"] == "hello"
        for frame in ignored:
            await ws.send_to(text_data=frame)
        await ws.send_to(bytes_data=b"\xff\xfe\x00")
        await ws.send_json_to({"type": "ping"})  # still open, still answering
        while (message := await ws.receive_json_from(timeout=5))["event"] != "pong":
            assert message["event"] == "logs.end", message  # the follows: nothing to follow
        await ws.disconnect()
        for frame in too_big:
            ws = socket(path, cookie)
            assert (await ws.connect())[0]
            await ws.send_to(text_data=frame)
            assert await close_code(ws) == 1009, (path, frame[:20])
        assert await sync_to_async(row_counts)() == before, path
    assert tracebacks(caplog) == []
