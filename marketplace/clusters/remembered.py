"""The API keys the gateway lets through by itself while no web process answers it.

Every request to a cluster's URL asks a web process first (``auth.py``). So that a web outage
(a deploy, a crash) does not take every cluster's URL down with it, the gateway also keeps,
per cluster, the ``Authorization`` headers of the keys a web process let through recently
(``scheduler.gateway.fallback_routes``); it uses them only when its sub-request fails.

- A key joins when a web process lets it through (``key_passed``): that process pushes the
  routes within a second (a background thread, pushes coalesced), the key among them. Only
  the web process that saw the key can add it: the platform stores a key's hash, never the
  key.
- Every push, from any process, checks every remembered key again against the database (not
  revoked, not expired, the cluster's team, its creator still a member) and drops those that
  fail or that no web process let through for ``GATEWAY_REMEMBER_SECONDS`` (Redis holds
  when each was last let through, by the key's digest). Revoking a key and removing a member
  push on commit; the beat pushes every 30 s (a key that expires by its date).
- Console sessions are not remembered: they are checked by a web process every time.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable

import redis
from django.conf import settings
from django.db import connection

from marketplace.clusters import traffic
from marketplace.models import ApiKey
from marketplace.services.accounts import API_KEY_PREFIX, api_keys_with_creator_role

logger = logging.getLogger(__name__)

# Per cluster, so a team's fallback stays a list Caddy compares in microseconds.
MAX_PER_CLUSTER = 5000
BEARER = "Bearer "
# A push waits this long for other keys let through meanwhile, so a burst of new keys costs
# one gateway reload, not one each.
COALESCE_SECONDS = 0.5

_pending: dict[int, set[str]] = {}
_pushed: set[tuple[int, bytes]] = set()  # (cluster, digest) the gateway remembers already
_noted: dict[bytes, float] = {}  # digest: when this process last noted the key in Redis
MAX_NOTED = 50_000
_lock = threading.Lock()
_wake = threading.Event()
_pusher: threading.Thread | None = None
_push: Callable[[], object] | None = None  # routes' push, once routes has loaded


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _seen_key(digest: bytes) -> str:
    return f"{traffic.key_prefix()}:gateway:seen:{digest.hex()}"


def key_passed(cluster_id: int, key: str) -> bool:
    """A web process let ``key`` through to this cluster: have the gateway remember the key if
    it does not yet. True when it is time to note in Redis when the key was let through
    (``seen_now``): the caller does, where it may wait for Redis (off an event loop)."""
    if not settings.GATEWAY_ADMIN or not key.startswith(f"{API_KEY_PREFIX}_"):
        return False
    digest = _digest(key)
    due = _noted_long_ago(digest)
    if (cluster_id, digest) not in _pushed:
        with _lock:
            _pending.setdefault(cluster_id, set()).add(key)
        _pusher_wake()
    return due


def _noted_long_ago(digest: bytes) -> bool:
    """Whether this process last noted the key in Redis a tenth of the remembered time ago or
    more (or never): noting it on every request would be a Redis write per request for a
    figure that only needs to be right to within minutes."""
    now = time.monotonic()
    last = _noted.get(digest)
    if last is not None and now - last < settings.GATEWAY_REMEMBER_SECONDS / 10:
        return False
    with _lock:
        if len(_noted) > MAX_NOTED:  # keys anyone may send: kept bounded
            _noted.clear()
        _noted[digest] = now
    return True


def seen_now(key: str) -> None:
    """Note that a web process let ``key`` through now (by its digest, for
    ``GATEWAY_REMEMBER_SECONDS``)."""
    try:
        traffic.redis_client().set(_seen_key(_digest(key)), 1, ex=settings.GATEWAY_REMEMBER_SECONDS)
    except redis.RedisError:
        logger.warning("could not note a key the gateway let through (Redis)")


def _pusher_wake() -> None:
    global _pusher
    with _lock:
        if _pusher is None or not _pusher.is_alive():
            _pusher = threading.Thread(target=_push_loop, name="gateway-remember", daemon=True)
            _pusher.start()
    _wake.set()


def push_with(push: Callable[[], object]) -> None:
    """What the pusher runs: ``routes.routes_push``, given by routes as it loads (it imports
    this module, so this one does not import it)."""
    global _push
    _push = push


def _push_loop() -> None:
    while True:
        _wake.wait()
        time.sleep(COALESCE_SECONDS)
        _wake.clear()
        try:
            if _push is not None:
                _push()
        except Exception:  # a failed push is retried by the next key or the beat
            logger.exception("gateway routes not pushed")
        finally:
            connection.close()  # this thread's own connection, not kept between pushes


def pending_take() -> dict[int, set[str]]:
    """The keys this process let through that the gateway may not remember yet."""
    with _lock:
        taken = dict(_pending)
        _pending.clear()
    return taken


def pending_put_back(taken: dict[int, set[str]]) -> None:
    """A push that did not land: its new keys wait for the next."""
    with _lock:
        for cluster_id, keys in taken.items():
            _pending.setdefault(cluster_id, set()).update(keys)


def pushed(kept: dict[int, set[str]]) -> None:
    """The gateway now remembers exactly ``kept``."""
    global _pushed
    _pushed = {(c, _digest(k)) for c, keys in kept.items() for k in keys}


def from_headers(headers: dict[int, set[str]]) -> dict[int, set[str]]:
    """Keys out of the ``Authorization`` values the gateway remembers."""
    return {
        c: {h.removeprefix(BEARER) for h in values if h.startswith(BEARER)}
        for c, values in headers.items()
    }


def as_headers(keys: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(BEARER + k for k in keys))


def still_allowed(candidates: dict[int, set[str]], teams: dict[int, int]) -> dict[int, set[str]]:
    """Of the keys per cluster, those a web process would let through now and let through
    within ``GATEWAY_REMEMBER_SECONDS``; clusters not in ``teams`` (gone) keep none."""
    candidates = {c: keys for c, keys in candidates.items() if c in teams and keys}
    by_prefix: dict[str, ApiKey] = {}
    prefixes = {_prefix(k) for keys in candidates.values() for k in keys} - {None}
    if prefixes:
        for api_key in api_keys_with_creator_role(ApiKey.objects.filter(prefix__in=prefixes)):
            by_prefix[api_key.prefix] = api_key
    seen = _seen([k for keys in candidates.values() for k in keys])
    out: dict[int, set[str]] = {}
    for cluster_id, keys in candidates.items():
        allowed = sorted(
            k
            for k in keys
            if k in seen and _allows(by_prefix.get(_prefix(k) or ""), k, teams[cluster_id])
        )
        if allowed:
            out[cluster_id] = set(allowed[:MAX_PER_CLUSTER])
    return out


def _prefix(key: str) -> str | None:
    parts = key.split("_", 2)
    return parts[1] if len(parts) == 3 and parts[0] == API_KEY_PREFIX else None


def _allows(api_key: ApiKey | None, key: str, team_id: int) -> bool:
    """What ``auth._key_allows`` checks, on a key already read."""
    return (
        api_key is not None
        and api_key.key_hash == ApiKey.hash_secret(key)
        and api_key.is_active
        and api_key.team_id == team_id
        and api_key.allows_audience(ApiKey.Audience.RENTER)
        and api_key.acting_role(api_key.creator_role) is not None
    )


def _seen(keys: list[str]) -> set[str]:
    """Those of ``keys`` a web process let through within ``GATEWAY_REMEMBER_SECONDS``; all
    of them while Redis does not answer (the database's checks still apply)."""
    if not keys:
        return set()
    try:
        found = traffic.redis_client().mget([_seen_key(_digest(k)) for k in keys])
    except redis.RedisError:
        return set(keys)
    return {k for k, hit in zip(keys, found, strict=True) if hit is not None}


def forget() -> None:
    """This process forgets what it pushed (tests that start a fresh gateway)."""
    global _pushed
    with _lock:
        _pending.clear()
        _noted.clear()
        _pushed = set()
