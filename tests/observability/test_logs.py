"""Structured logs: one JSON object a line, and a rental's launch followed from the API call
down to the SSH commands on its host by the request id, team id and instance id."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.conf import settings

from tests.conftest import key_client

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

# Exits at once on `docker stop`.
QUICK_STOP = ["-c", "trap 'exit 0' TERM; echo up; while :; do sleep 1; done"]


class ConsoleCapture:
    """Points the configured "console" handler (settings.LOGGING, the one production writes
    through) at a buffer for the duration, so the test reads exactly what it would print."""

    def __enter__(self):
        root = logging.getLogger()
        self.handler = next(h for h in root.handlers if h.get_name() == "console")
        self.buffer = io.StringIO()
        self.previous = self.handler.setStream(self.buffer)
        self.level = root.level
        root.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        self.handler.setStream(self.previous)
        logging.getLogger().setLevel(self.level)

    def lines(self) -> list[dict]:
        # Every line is a JSON object, whoever logged it (ours, Django, Celery, structlog).
        return [json.loads(line) for line in self.buffer.getvalue().splitlines() if line]


def test_a_rental_launch_is_logged_as_json_with_request_team_and_instance_ids(funded_team, machine):
    assert settings.LOG_FORMAT == "json"  # DEBUG off, as in production
    client = key_client(funded_team)
    with ConsoleCapture() as capture:
        response = client.post(
            "/api/v1/instances/",
            {
                "machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
                "duration_hours": 1, "entrypoint": "sh", "args": QUICK_STOP, "ports": [],
            },
            format="json",
        )  # fmt: skip
    assert response.status_code == 201, response.content
    instance_id = response.json()["id"]
    lines = capture.lines()

    finished = [line for line in lines if line["event"] == "request_finished"]
    assert len(finished) == 1, lines
    request_id = finished[0]["request_id"]
    assert finished[0]["team_id"] == funded_team.pk and finished[0]["code"] == 201

    # The launch task ran (eagerly here, in a worker in production) under the request's id,
    # and its SSH commands carry the rental's instance and team.
    docker_run = [
        line for line in lines if line.get("command") == "docker run" and "exit_code" in line
    ]
    assert len(docker_run) == 1, [line["event"] for line in lines]
    assert docker_run[0]["request_id"] == request_id
    assert docker_run[0]["instance_id"] == instance_id
    assert docker_run[0]["team_id"] == funded_team.pk
    assert docker_run[0]["machine_id"] == machine.pk
    assert docker_run[0]["exit_code"] == 0 and docker_run[0]["level"] == "info"
    launched = [
        line for line in lines if line["event"] == f"launch of instance {instance_id}: running"
    ]
    assert launched and launched[0]["request_id"] == request_id
    # The rental's context ends with its task: nothing after it names the instance wrongly.
    assert "instance_id" not in finished[0]


def test_a_request_line_names_the_peer_not_an_address_the_client_wrote(funded_team):
    """Without a proxy in front, X-Forwarded-For is whatever the client says: the line keeps
    the address the request came from (uvicorn puts a trusted proxy's client there)."""
    client = key_client(funded_team)
    with ConsoleCapture() as capture:
        response = client.get(
            "/api/v1/me/", HTTP_X_FORWARDED_FOR="203.0.113.9", REMOTE_ADDR="198.51.100.7"
        )
    assert response.status_code == 200, response.content
    finished = [line for line in capture.lines() if line["event"] == "request_finished"]
    assert len(finished) == 1
    assert finished[0]["ip"] == "198.51.100.7"
    assert finished[0]["team_id"] == funded_team.pk
    assert "203.0.113.9" not in json.dumps(capture.lines())
