"""``/healthz`` and ``/readyz``: what a service manager or load balancer asks a web process.

``/healthz`` answers 200 while the process serves requests; it touches nothing else, so a
database outage never gets healthy processes restarted. ``/readyz`` answers 200 only when
the database, Redis (cache and channel layer) and the Celery broker all answer within
``READINESS_TIMEOUT_SECONDS`` each, and 503 otherwise, naming in its JSON body the ones that
did not: a process that cannot reach them is taken out of the balancer, not restarted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from kombu import Connection as BrokerConnection

logger = logging.getLogger(__name__)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "alive"})


def database_check() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def redis_urls() -> list[str]:
    """The Redis servers behind the cache and the channel layer (the same one, usually)."""
    urls: list[str] = []
    cache = settings.CACHES.get("default", {})
    if "redis" in cache.get("BACKEND", "").lower():
        location = cache.get("LOCATION")
        urls.extend([location] if isinstance(location, str) else list(location or []))
    layer = settings.CHANNEL_LAYERS.get("default", {})
    for host in layer.get("CONFIG", {}).get("hosts", []):
        address = host.get("address") if isinstance(host, dict) else host
        if isinstance(address, str):
            urls.append(address)
    return list(dict.fromkeys(urls))


def redis_ping(url: str) -> None:
    timeout = settings.READINESS_TIMEOUT_SECONDS
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()


def redis_check() -> None:
    for url in redis_urls():
        redis_ping(url)


def broker_check() -> None:
    url = settings.CELERY_BROKER_URL
    if urlsplit(url).scheme in {"redis", "rediss"}:
        redis_ping(url)
        return
    with BrokerConnection(url, connect_timeout=settings.READINESS_TIMEOUT_SECONDS) as broker:
        broker.ensure_connection(max_retries=1)


CHECKS: dict[str, Callable[[], None]] = {
    "database": database_check,
    "redis": redis_check,
    "broker": broker_check,
}


def check_result(name: str, check: Callable[[], None]) -> dict[str, object]:
    started = time.perf_counter()
    try:
        check()
    except Exception as error:  # any failure means "not ready"; the body says which
        # The body is public: it names the kind of error, the log line has the details
        # (addresses, database names).
        logger.warning("readiness check %s failed: %s: %s", name, type(error).__name__, error)
        outcome: dict[str, object] = {"ok": False, "error": type(error).__name__}
    else:
        outcome = {"ok": True}
    outcome["ms"] = round((time.perf_counter() - started) * 1000, 1)
    return outcome


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks = {name: check_result(name, check) for name, check in CHECKS.items()}
    failed = [name for name, result in checks.items() if not result["ok"]]
    body = {"status": "unready" if failed else "ready", "failed": failed, "checks": checks}
    return JsonResponse(body, status=503 if failed else 200)
