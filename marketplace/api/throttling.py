"""Rate limits of the API, counted per principal: an API key, else a signed-in user.

Two budgets, each a sliding window kept in the cache (Redis), shared by every web process:

- ``write``: requests that change something (POST/PUT/PATCH/DELETE, except searches that only
  read) — renting, stopping, registering machines, top-ups;
- ``offer_search``: offer searches, the most expensive read.

The rates are settings (``API_THROTTLE_RATES``, from the environment), generous enough for a
person or a script and for the test suite; a client over its budget gets 429 with
``Retry-After``. Password log-ins are limited separately, by django-axes.

A window is a sorted set of request times in Redis, trimmed, counted and added to by one Lua
script: one round trip a request (DRF's own throttle reads the whole history list and writes
it back, two round trips and a pickle of up to a budget's worth of times), and atomic, so two
processes cannot both take a budget's last request.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import redis
from django.conf import settings
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from marketplace.api.permissions import is_read
from marketplace.models import ApiKey

# KEYS[1]: the window; ARGV: now, the window's length in seconds, the budget, a unique member.
# Answers {1} when the request fits (and records it), else {0, the oldest request's time}.
_TAKE = """
local now, duration, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - duration)
if redis.call('ZCARD', KEYS[1]) >= budget then
  return {0, redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]}
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(duration))
return {1}
"""
_scripts: dict[str, redis.commands.core.Script] = {}


def _take_script() -> redis.commands.core.Script:
    """The script on a client of the cache's Redis, made once per process (and per URL)."""
    url = settings.CACHES["default"]["LOCATION"]
    if url not in _scripts:
        _scripts[url] = redis.Redis.from_url(url).register_script(_TAKE)
    return _scripts[url]


def principal(request) -> str | None:
    """Whose budget a request spends: its API key's, else its user's (None: anonymous)."""
    if isinstance(request.auth, ApiKey):
        return f"key:{request.auth.pk}"
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.pk is not None:
        return f"user:{user.pk}"
    return None


class PrincipalRateThrottle(SimpleRateThrottle):
    """One budget per principal for the requests ``applies`` picks; anonymous requests are
    refused by the permission check before throttling, so they spend none."""

    def get_rate(self) -> str | None:
        # Read when used, not when the class is imported (DRF's default), so a changed
        # setting applies at once.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def applies(self, request, view) -> bool:
        raise NotImplementedError

    def get_cache_key(self, request, view) -> str | None:
        ident = principal(request)
        if ident is None or not self.applies(request, view):
            return None
        prefix = settings.CACHES["default"].get("KEY_PREFIX", "")
        return f"{prefix}:throttle:{self.scope}:{ident}"

    def allow_request(self, request, view) -> bool:
        """Counts the request in its principal's window, unless the window is full."""
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.now = self.timer()
        answer = _take_script()(
            keys=[self.key], args=[self.now, self.duration, self.num_requests, uuid.uuid4().hex]
        )
        if answer[0]:
            return True
        self.oldest = float(answer[1])
        return self.throttle_failure()

    def wait(self) -> float:
        """Seconds until the window's oldest request leaves it (``Retry-After``)."""
        return max(self.duration - (self.now - self.oldest), 0.0)


class WriteRateThrottle(PrincipalRateThrottle):
    scope = "write"

    def applies(self, request, view) -> bool:
        return not is_read(request, view)


class OfferSearchRateThrottle(PrincipalRateThrottle):
    scope = "offer_search"

    def applies(self, request, view) -> bool:
        return getattr(view, "throttle_scope", None) == self.scope


def throttle_scope(scope: str) -> Callable:
    """Puts a function API view in a throttle scope (``offer_search``). Above ``@api_view``."""

    def mark(view):
        view.cls.throttle_scope = scope
        return view

    return mark
