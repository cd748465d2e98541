"""Rate limits of the API, counted per principal: an API key, else a signed-in user.

Two budgets, each a sliding window kept in the cache (Redis), shared by every web process:

- ``write``: requests that change something (POST/PUT/PATCH/DELETE, except searches that only
  read) — renting, stopping, registering machines, top-ups;
- ``offer_search``: offer searches, the most expensive read.

The rates are settings (``API_THROTTLE_RATES``, from the environment), generous enough for a
person or a script and for the test suite; a client over its budget gets 429 with
``Retry-After``. Password log-ins are limited separately, by django-axes.
"""

from __future__ import annotations

from collections.abc import Callable

from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from marketplace.api.permissions import is_read
from marketplace.models import ApiKey


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
        return self.cache_format % {"scope": self.scope, "ident": ident}


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
