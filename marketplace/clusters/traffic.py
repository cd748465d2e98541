"""Requests per second through each cluster's URL, as the gateway lets them through.

Every request the gateway passes to a cluster first asks ``/gateway/auth/<id>/``, so the
forward-auth answer sees each one, per cluster (Caddy 2.6's own metrics count per server and
handler, not per route). Each web process counts in memory and adds its counts to Redis
once a second (a key per cluster and second, kept two minutes); the autoscaler reads them.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import redis
from django.conf import settings

KEEP_SECONDS = 120

_counts: dict[int, int] = defaultdict(int)
_second = 0
_lock = threading.Lock()
_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1)
    return _client


def _key(cluster_id: int, second: int) -> str:
    prefix = settings.CACHES["default"].get("KEY_PREFIX", "")
    return f"{prefix}:gateway:requests:{cluster_id}:{second}"


def request_passed(cluster_id: int) -> None:
    """Count one request let through to the cluster; flush the last second's counts when
    the second turns."""
    global _second
    now = int(time.time())
    flush: dict[int, int] = {}
    with _lock:
        if now != _second:
            flush, second = dict(_counts), _second
            _counts.clear()
            _second = now
        _counts[cluster_id] += 1
    if flush:
        _flush(flush, second)


def _flush(counts: dict[int, int], second: int) -> None:
    try:
        pipe = _redis().pipeline(transaction=False)
        for cluster_id, count in counts.items():
            pipe.incrby(_key(cluster_id, second), count)
            pipe.expire(_key(cluster_id, second), KEEP_SECONDS)
        pipe.execute()
    except redis.RedisError:
        pass  # a lost second of counts only makes the autoscaler see less traffic for it


def flush_now() -> None:
    """Write what this process counted so far (tests, and a web process shutting down)."""
    with _lock:
        counts, second = dict(_counts), _second
        _counts.clear()
    if counts:
        _flush(counts, second)


def per_second(cluster_id: int, seconds: int) -> list[int]:
    """Requests let through in each of the last ``seconds`` whole seconds (oldest first)."""
    now = int(time.time())
    keys = [_key(cluster_id, s) for s in range(now - seconds, now)]
    try:
        values = _redis().mget(keys)
    except redis.RedisError:
        return [0] * seconds
    return [int(v or 0) for v in values]
