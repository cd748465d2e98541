"""A service the web process depends on is down: answer 503 with Retry-After, naming it.

Redis (the cache behind authentication and throttling, the broker, the channel layer) and the
database are not our code's failures, and a client can do nothing but wait: a 500 with "it
was logged" tells it the wrong thing. What raised is told by the exception's type (the
clients' own connection errors), never by its wording. Nothing was written: a database
error rolls the request's transaction back, and Redis fails before any write of ours.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

# Seconds a client is told to wait before trying again.
RETRY_AFTER = 5

SERVICES = {
    "database": "The database is not answering (or is busy with another writer)",
    "redis": "Redis (the cache and task queue) is not answering",
}


def service_down(exc: BaseException | None) -> str | None:
    """Which service ``exc`` (or an exception it was raised from) says is down, if any."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, RedisConnectionError | RedisTimeoutError | BrokerError):
            return "redis"
        if isinstance(exc, OperationalError | InterfaceError):
            return "database"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def outage_body(service: str) -> dict:
    message = f"{SERVICES[service]}; nothing was changed. Try again in a few seconds."
    return {"error": {"code": "service_unavailable", "message": message, "fields": {}}}


def outage_response(request: HttpRequest, service: str, exc: BaseException) -> HttpResponse:
    """503 in the API's error shape (a short page elsewhere), with Retry-After; logged once,
    without a traceback: the outage is the news, not where it surfaced."""
    logger.warning("answered 503 for %s: %s is down (%s)", request.path, service, exc)
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse(outage_body(service), status=503)
    else:
        response = HttpResponse(
            f"<!doctype html><title>Back in a moment</title><h1>Back in a moment</h1>"
            f"<p>{outage_body(service)['error']['message']}</p>",
            status=503,
        )
    response["Retry-After"] = str(RETRY_AFTER)
    return response
