"""The gateway's forward-auth answer: may this request reach this cluster's URL?

Caddy asks ``GET /gateway/auth/<cluster id>/`` with the caller's headers before every request
to a cluster's URL. A member of the cluster's team passes (200): a console session cookie, or
``Authorization: Bearer gpk_…`` of a key of that team (its creator still a member, a renter
audience). Anything else is 401, the same 401 for a cluster that does not exist or is
another team's, so a caller cannot learn which clusters exist.

Every request through the gateway makes this sub-request, so it must be fast: the answer is
remembered per (cluster, credential digest) in this process for
``GATEWAY_AUTH_CACHE_SECONDS`` (a revoked key or removed member stops working within that
time), and ``GatewayAuthMiddleware`` answers before the rest of the middleware chain (the
console's active team, request logging: not wanted for a sub-request).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time

from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from marketplace.clusters import traffic
from marketplace.models import ApiKey, Cluster, Membership
from marketplace.services.accounts import api_key_authenticate

PATH = re.compile(r"^/gateway/auth/(\d{1,18})/$")
MAX_REMEMBERED = 50_000

_remembered: dict[tuple[int, bytes], tuple[float, bool]] = {}
_teams: dict[int, tuple[float, int | None]] = {}
_lock = threading.Lock()


def _now() -> float:
    return time.monotonic()


def _cluster_team(cluster_id: int) -> int | None:
    """The team of a cluster (a cluster never changes team), remembered a while."""
    hit = _teams.get(cluster_id)
    if hit is not None and hit[0] > _now():
        return hit[1]
    team_id = Cluster.objects.filter(pk=cluster_id).values_list("team_id", flat=True).first()
    _teams[cluster_id] = (_now() + settings.GATEWAY_AUTH_CACHE_SECONDS, team_id)
    return team_id


def _key_allows(token: str, team_id: int) -> bool:
    api_key = api_key_authenticate(token)
    if api_key is None or api_key.team_id != team_id:
        return False
    if not api_key.allows_audience(ApiKey.Audience.RENTER):
        return False
    return api_key.acting_role(api_key.creator_role) is not None


def _session_allows(request: HttpRequest, team_id: int) -> bool:
    if not hasattr(request, "session"):
        engine = import_string(settings.SESSION_ENGINE)
        request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
    user = get_user(request)  # checks the session's password hash, as the console does
    if not user.is_authenticated or not user.is_active:
        return False
    return Membership.objects.filter(user=user, team_id=team_id).exists()


def request_allowed(request: HttpRequest, cluster_id: int) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    cookie = request.COOKIES.get(settings.SESSION_COOKIE_NAME, "")
    if scheme.lower() == "bearer" and token:
        credential = b"k" + token.encode()
    elif cookie:
        credential = b"s" + cookie.encode()
    else:
        return False
    memo = (cluster_id, hashlib.sha256(credential).digest())
    hit = _remembered.get(memo)
    if hit is not None and hit[0] > _now():
        return hit[1]
    team_id = _cluster_team(cluster_id)
    if team_id is None:
        allowed = False
    elif credential.startswith(b"k"):
        allowed = _key_allows(token, team_id)
    else:
        allowed = _session_allows(request, team_id)
    with _lock:
        if len(_remembered) > MAX_REMEMBERED:
            _remembered.clear()
        _remembered[memo] = (_now() + settings.GATEWAY_AUTH_CACHE_SECONDS, allowed)
    return allowed


def gateway_auth(request: HttpRequest, cluster_id: int) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405)
    if request_allowed(request, int(cluster_id)):
        traffic.request_passed(int(cluster_id))
        return HttpResponse(status=200)
    response = HttpResponse(
        '{"detail": "Authentication required."}', status=401, content_type="application/json"
    )
    response["WWW-Authenticate"] = 'Bearer realm="cluster"'
    return response


class GatewayAuthMiddleware:
    """Answers the gateway's sub-requests before the rest of the chain."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        match = PATH.match(request.path_info)
        if match is None:
            return self.get_response(request)
        return gateway_auth(request, int(match.group(1)))


def forget() -> None:
    """Drop every remembered answer (tests that revoke and check at once)."""
    with _lock:
        _remembered.clear()
        _teams.clear()
