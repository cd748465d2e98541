"""An API request as the web processes serve it (ASGI, marketplace.asgi), where Django's
middleware and the view run in one thread hop: the answer, the security headers, the
request's metrics and its log line are those the test client sees through WSGI-style calls."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator
from django.db import connections

from marketplace.services.accounts import api_key_create
from tests.observability.test_logs import ConsoleCapture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

RESPONSES = "django_http_responses_total_by_status_view_method_total"


async def call(path: str, *, key: str = "", method: str = "GET", body: bytes = b"") -> dict:
    from marketplace.asgi import application

    headers = [(b"host", b"localhost")]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
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


async def test_a_refused_rent_through_asgi_names_the_field(funded_team):
    key = await sync_to_async(issue_key)(funded_team)
    body = json.dumps({"machine_id": 1, "image": "busybox", "duration_hours": 1}).encode()
    response = await call("/api/v1/instances/", key=key, method="POST", body=body)
    assert response["status"] == 400, response["body"]
    assert json.loads(response["body"])["error"]["fields"] == {
        "num_gpus": ["This field is required (or ask for a slice with gpu_share)."]
    }
    await sync_to_async(connections.close_all)()
