"""An API request as the web processes serve it (ASGI, marketplace.asgi), where Django's
middleware and the view run in one call to a thread the process keeps: the answer, the
security headers, the request's metrics and its log line are those the test client sees
through WSGI-style calls; a streamed answer arrives whole; and what one request sets in its
thread never reaches the next one served there."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator
from django.conf import settings
from django.db import connections
from django.test import Client

from marketplace.services.accounts import api_key_create
from tests.observability.test_logs import ConsoleCapture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

RESPONSES = "django_http_responses_total_by_status_view_method_total"


async def call(
    path: str, *, key: str = "", method: str = "GET", body: bytes = b"", cookie: str = ""
) -> dict:
    from marketplace.asgi import application

    headers = [(b"host", b"localhost")]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    if body:
        headers.append((b"content-type", b"application/json"))
        headers.append((b"content-length", str(len(body)).encode()))
    communicator = HttpCommunicator(application, method, path, body=body, headers=headers)
    response = await communicator.get_response(timeout=10)
    # Until Django has closed the response: its database connection goes back then.
    await communicator.wait(timeout=10)
    return response


def counted(text: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == RESPONSES and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return sample.value
    return 0.0


def issue_key(team) -> str:
    membership = team.memberships.get()
    return api_key_create(membership=membership, name="asgi", access="write").secret


async def test_an_api_key_request_through_asgi_is_answered_counted_and_logged(
    funded_team, metrics_token
):
    key = await sync_to_async(issue_key)(funded_team)
    series = {"view": "api-me", "method": "GET", "status": "200"}
    before = counted((await call("/metrics", key=metrics_token))["body"].decode(), **series)

    with ConsoleCapture() as capture:
        response = await call("/api/v1/me/", key=key)
    assert response["status"] == 200, response["body"]
    assert json.loads(response["body"])["team"]["id"] == funded_team.pk
    headers = {name.decode().lower(): value.decode() for name, value in response["headers"]}
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "same-origin"

    finished = [line for line in capture.lines() if line["event"] == "request_finished"]
    assert len(finished) == 1, capture.lines()
    assert finished[0]["request_id"] and finished[0]["team_id"] == funded_team.pk
    assert finished[0]["code"] == 200

    after = counted((await call("/metrics", key=metrics_token))["body"].decode(), **series)
    assert after == before + 1
    await sync_to_async(connections.close_all)()


async def test_every_answer_says_how_long_the_process_took_to_answer(funded_team):
    """``Server-Timing: app;dur=<ms>`` (core/server_timing.py), which browsers' developer
    tools show and the offer search bench judges its budget on: more than nothing, and no
    more than the whole call took, on an answer and on a refusal alike."""
    key = await sync_to_async(issue_key)(funded_team)
    for path, headers_key, status in [("/api/v1/me/", key, 200), ("/api/v1/me/", "", 401)]:
        started = time.perf_counter()
        response = await call(path, key=headers_key)
        took = (time.perf_counter() - started) * 1000
        assert response["status"] == status, response["body"]
        timings = [v.decode() for n, v in response["headers"] if n.lower() == b"server-timing"]
        assert len(timings) == 1, response["headers"]
        name, _, duration = timings[0].partition(";dur=")
        assert name == "app"
        assert 0 < float(duration) <= took
    await sync_to_async(connections.close_all)()


async def test_an_offer_search_also_says_how_long_the_search_itself_took(funded_team):
    """The offer search adds ``search;dur=<ms>``, the search's own work (the offer index or
    SQL, and the page's rows), which the offer bench weighs the rest of the answer against:
    more than nothing and no more than the whole answer, on a GET and on a JSON body."""
    key = await sync_to_async(issue_key)(funded_team)
    for method, path, body in [
        ("GET", "/api/v1/offers/?q=num_gpus%3E%3D1&limit=5", b""),
        ("POST", "/api/v1/offers/", json.dumps({"num_gpus": {"gte": 1}}).encode()),
    ]:
        response = await call(path, key=key, method=method, body=body)
        assert response["status"] == 200, response["body"]
        timings = dict(
            v.decode().split(";dur=")
            for n, v in response["headers"]
            if n.lower() == b"server-timing"
        )
        assert set(timings) == {"app", "search"}, response["headers"]
        assert 0 < float(timings["search"]) <= float(timings["app"])
    await sync_to_async(connections.close_all)()


async def test_a_refused_rent_through_asgi_names_the_field(funded_team):
    key = await sync_to_async(issue_key)(funded_team)
    body = json.dumps({"machine_id": 1, "image": "busybox", "duration_hours": 1}).encode()
    response = await call("/api/v1/instances/", key=key, method="POST", body=body)
    assert response["status"] == 400, response["body"]
    assert json.loads(response["body"])["error"]["fields"] == {
        "num_gpus": ["This field is required (or ask for a slice with gpu_share)."]
    }
    await sync_to_async(connections.close_all)()


def signed_in(user, team) -> tuple[Client, str]:
    """A browser signed in as ``user``, acting for ``team``: its test client and its session
    cookie."""
    from marketplace.tenancy import ACTIVE_TEAM_SESSION_KEY

    client = Client()
    client.force_login(user)
    session = client.session
    session[ACTIVE_TEAM_SESSION_KEY] = team.pk
    session.save()
    name = settings.SESSION_COOKIE_NAME
    return client, f"{name}={client.cookies[name].value}"


async def test_a_streamed_answer_through_asgi_arrives_whole(funded_team, owner):
    """The ledger's CSV is a stream read from the database as it goes: read in the request's
    thread, where its connection is, and written out whole, byte for byte what the test
    client's handler gives."""
    from asgiref.testing import ApplicationCommunicator

    from marketplace.asgi import application

    client, cookie = await sync_to_async(signed_in)(owner, funded_team)
    scope = {
        "type": "http", "http_version": "1.1", "method": "GET", "path": "/billing/ledger.csv",
        "raw_path": b"/billing/ledger.csv", "query_string": b"", "root_path": "",
        "scheme": "http", "headers": [(b"host", b"localhost"), (b"cookie", cookie.encode())],
        "client": ("127.0.0.1", 40000), "server": ("localhost", 80),
    }  # fmt: skip
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(timeout=10)
    assert start["status"] == 200
    headers = {name.decode().lower(): value.decode() for name, value in start["headers"]}
    assert headers["content-type"] == "text/csv; charset=utf-8"
    body = b""
    while True:  # a stream's parts, then an empty closing message
        message = await communicator.receive_output(timeout=10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(timeout=10)
    expected = await sync_to_async(
        lambda: b"".join(client.get("/billing/ledger.csv").streaming_content)
    )()
    lines = body.decode().splitlines()
    assert lines[0].startswith("time_utc,transfer_id,kind")
    assert len(lines) >= 2 and "test credit" in body.decode()  # the funding
    assert body == expected
    await sync_to_async(connections.close_all)()


async def test_one_request_leaves_nothing_for_the_next_on_its_thread(funded_team):
    """Requests share a few kept threads: the log context a request binds (its request id,
    its team) ends with it, as it did in a thread of its own."""
    import structlog

    import marketplace.asgi  # noqa: F401  (set up before the capture: it configures logging)

    key = await sync_to_async(issue_key)(funded_team)
    with ConsoleCapture() as capture:
        for _ in range(3):
            assert (await call("/api/v1/me/", key=key))["status"] == 200
        assert (await call("/healthz"))["status"] == 200
    finished = [line for line in capture.lines() if line["event"] == "request_finished"]
    assert len(finished) == 4, capture.lines()
    assert len({line["request_id"] for line in finished}) == 4
    assert [line.get("team_id") for line in finished] == [funded_team.pk] * 3 + [None]
    assert structlog.contextvars.get_contextvars() == {}  # the loop's own context untouched
    await sync_to_async(connections.close_all)()
