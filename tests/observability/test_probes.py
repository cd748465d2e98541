"""/healthz answers without touching anything; /readyz checks the database, Redis and the
broker for real and names what does not answer."""

from __future__ import annotations

import pytest

from tests.ports import closed_port


@pytest.fixture
def dead_port():
    """A local port that refuses connections for the whole test (tests/ports.py)."""
    with closed_port() as port:
        yield port


def test_healthz_answers_without_the_database(client):
    # No `db` fixture: pytest-django fails any query, so the probe provably makes none.
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "alive"}


@pytest.mark.django_db
def test_readyz_is_ready_when_database_redis_and_broker_answer(client):
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ready" and body["failed"] == []
    assert {name: check["ok"] for name, check in body["checks"].items()} == {
        "database": True,
        "redis": True,
        "broker": True,
    }


@pytest.mark.django_db
def test_readyz_is_503_naming_redis_when_redis_does_not_answer(client, settings, dead_port):
    dead = f"redis://127.0.0.1:{dead_port}/0"
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": dead}
    }
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [dead]}}
    }
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["status"] == "unready"
    assert body["failed"] == ["redis"]
    assert body["checks"]["redis"] == {
        "ok": False,
        "error": "ConnectionError",
        "ms": body["checks"]["redis"]["ms"],
    }
    assert body["checks"]["database"]["ok"] and body["checks"]["broker"]["ok"]
    # The public body names the failure, not the address it tried.
    assert dead not in response.content.decode()


@pytest.mark.django_db
def test_readyz_is_503_naming_the_broker_when_it_does_not_answer(client, settings, dead_port):
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{dead_port}/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["broker"]
