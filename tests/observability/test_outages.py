"""Redis or the database down: a 503 with Retry-After within 2 s that names what is down,
nothing written, and /healthz still answering (it touches neither).

Redis is "down" as a real client sees it: the cache points at a port this test holds bound
without listening, so every connection is refused by the kernel.
"""

from __future__ import annotations

import socket
import time

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from marketplace.models import Rental
from scheduler.models import Instance
from tests.conftest import key_client

pytestmark = pytest.mark.django_db

RENT = {
    "num_gpus": 1, "image": "gpumkt/busybox:latest", "duration_hours": 1, "disk_gb": 10,
    "ports": [],
}  # fmt: skip


@pytest.fixture
def redis_down(settings):
    """Call it to take Redis away (after a first request has loaded the code)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused

    def take_down() -> None:
        settings.CACHES = {
            "default": {
                **settings.CACHES["default"],
                "LOCATION": f"redis://127.0.0.1:{held.getsockname()[1]}/0",
            }
        }

    yield take_down
    held.close()


def quietly(client: APIClient) -> APIClient:
    client.raise_request_exception = False  # as a real server: the handler answers
    return client


def test_with_redis_down_the_api_answers_503_quickly_and_writes_nothing(funded_team, redis_down):
    client = quietly(key_client(funded_team))  # its key made while Redis was up
    for path in ("/api/v1/instances/", "/api/v1/offers/"):
        assert client.get(path).status_code == 200  # the code loaded, the key known
    redis_down()
    rentals, instances = Rental.objects.count(), Instance.objects.count()
    started = time.monotonic()
    response = client.post("/api/v1/instances/", {**RENT, "machine_id": 1}, format="json")
    assert response.status_code == 503, response.content
    assert time.monotonic() - started < 2
    assert response["Retry-After"] == "5"
    error = response.json()["error"]
    assert error["code"] == "service_unavailable"
    assert "Redis" in error["message"] and "nothing was changed" in error["message"]
    assert (Rental.objects.count(), Instance.objects.count()) == (rentals, instances)
    # Reads answer as they can (from the database) or say what is down: quickly, either way.
    for path in ("/api/v1/instances/", "/api/v1/offers/"):
        started = time.monotonic()
        response = client.get(path)
        assert response.status_code in (200, 503), (path, response.content)
        assert time.monotonic() - started < 2, path


def test_healthz_answers_with_redis_down(client, redis_down):
    assert client.get("/healthz").status_code == 200
    redis_down()
    started = time.monotonic()
    response = client.get("/healthz")
    assert response.status_code == 200
    assert time.monotonic() - started < 2


@pytest.mark.django_db(transaction=True)  # no test transaction holding the table's locks
def test_a_busy_database_answers_503_saying_to_retry(funded_team):
    """Another writer holds the table past the statement's patience: PostgreSQL cancels the
    statement (as SQLite gives up on a lock held past its timeout) and the answer is a 503
    saying to retry, never a 500."""
    client = quietly(key_client(funded_team))
    assert client.get("/api/v1/instances/").status_code == 200
    other = connections.create_connection("default")
    other.ensure_connection()
    other.set_autocommit(False)
    try:
        with other.cursor() as cursor:
            cursor.execute("SET lock_timeout = 5000")  # a mistake here fails, never hangs
            cursor.execute("LOCK TABLE scheduler_instance IN ACCESS EXCLUSIVE MODE")
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 300")
        response = client.get("/api/v1/instances/")
    finally:
        other.rollback()
        other.close()
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 0")
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    assert "database" in response.json()["error"]["message"]
