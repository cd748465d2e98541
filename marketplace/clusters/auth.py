"""The gateway's forward-auth answer: may this request reach this cluster's URL?

Caddy asks ``GET /gateway/auth/<cluster id>/`` with the caller's headers before every request
to a cluster's URL. A member of the cluster's team passes (200): a console session cookie, or
``Authorization: Bearer gpk_…`` of a key of that team (its creator still a member, a renter
audience). Anything else is 401, the same 401 for a cluster that does not exist or is
another team's, so a caller cannot learn which clusters exist.

Every request through the gateway makes this sub-request, so it must be fast: the answer is
remembered per (cluster, credential digest) in this process for
``GATEWAY_AUTH_CACHE_SECONDS`` (a revoked key or removed member stops working within that
time). Under ASGI (production, ``make run``) ``GatewayAuthFastPath`` answers in front of
Django's request handling altogether: a remembered answer on the event loop, a first look at
a key on the loop too (``key_looks``, PostgreSQL), any other first look in the one thread the
looks share. Elsewhere (WSGI, the test client) ``GatewayAuthMiddleware`` answers before the
rest of the middleware chain (the console's active team, request logging: not wanted for a
sub-request).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
import time
from collections.abc import Mapping

import psycopg
from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from django.http.cookie import parse_cookie
from django.utils.module_loading import import_string

from marketplace.clusters import key_looks, traffic
from marketplace.clusters.remembered import key_passed, seen_now
from marketplace.models import ApiKey, Cluster, Membership
from marketplace.services.accounts import api_key_authenticate

logger = logging.getLogger(__name__)

PATH = re.compile(r"^/gateway/auth/(\d{1,18})/$")
MAX_REMEMBERED = 50_000

_remembered: dict[tuple[int, bytes], tuple[float, bool]] = {}
_teams: dict[int, tuple[float, int | None]] = {}
_looking: set[tuple[int, bytes]] = set()  # answers being looked at again now
_lock = threading.Lock()


def _now() -> float:
    return time.monotonic()


_UNKNOWN = object()


def _team_remembered(cluster_id: int):
    """The team of a cluster as remembered (a cluster never changes team), or ``_UNKNOWN``."""
    hit = _teams.get(cluster_id)
    return hit[1] if hit is not None and hit[0] > _now() else _UNKNOWN


def _team_remember(cluster_id: int, team_id: int | None) -> int | None:
    with _lock:
        if len(_teams) > MAX_REMEMBERED:  # ids anyone may ask about: kept bounded
            _teams.clear()
        _teams[cluster_id] = (_now() + settings.GATEWAY_AUTH_CACHE_SECONDS, team_id)
    return team_id


def _cluster_team(cluster_id: int) -> int | None:
    team_id = _team_remembered(cluster_id)
    if team_id is not _UNKNOWN:
        return team_id
    found = Cluster.objects.filter(pk=cluster_id).values_list("team_id", flat=True).first()
    return _team_remember(cluster_id, found)


def _key_passes(api_key: ApiKey | None, team_id: int) -> bool:
    """Whether an authenticated key (None: none passed) may reach the team's clusters."""
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


def credential_of(authorization: str, cookies: Mapping[str, str]) -> tuple[bytes, str] | None:
    """The caller's credential as remembered (a digest's input) and the key's text, or None."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        return b"k" + token.encode(), token
    cookie = cookies.get(settings.SESSION_COOKIE_NAME, "")
    if cookie:
        return b"s" + cookie.encode(), ""
    return None


def _credential(request: HttpRequest) -> tuple[bytes, str] | None:
    return credential_of(request.headers.get("Authorization", ""), request.COOKIES)


def _memo(cluster_id: int, credential: bytes) -> tuple[int, bytes]:
    return cluster_id, hashlib.sha256(credential).digest()


def remembered(request: HttpRequest, cluster_id: int) -> bool | None:
    return remembered_for(_credential(request), cluster_id)


def remembered_for(found: tuple[bytes, str] | None, cluster_id: int) -> bool | None:
    """The answer given to this credential for this cluster in the last few seconds, or None
    (no credential at all is a refusal, answered at once)."""
    if found is None:
        return False
    hit = _remembered.get(_memo(cluster_id, found[0]))
    if hit is not None and hit[0] > _now():
        return hit[1]
    return None


def request_allowed(request: HttpRequest, cluster_id: int) -> bool:
    answer = remembered(request, cluster_id)
    if answer is not None:
        return answer
    return check(request, cluster_id)


def check(request: HttpRequest, cluster_id: int) -> bool:
    """Look again (the database), and remember the answer."""
    credential, token = _credential(request)
    team_id = _cluster_team(cluster_id)
    if team_id is None:
        allowed = False
    elif credential.startswith(b"k"):
        allowed = _key_passes(api_key_authenticate(token, related=False), team_id)
        # The gateway's own memory of the key, for a web outage.
        if allowed and key_passed(cluster_id, token):
            seen_now(token)
    else:
        allowed = _session_allows(request, team_id)
    return _remember(cluster_id, credential, allowed)


def _remember(cluster_id: int, credential: bytes, allowed: bool) -> bool:
    with _lock:
        if len(_remembered) > MAX_REMEMBERED:
            _remembered.clear()
        _remembered[_memo(cluster_id, credential)] = (
            _now() + settings.GATEWAY_AUTH_CACHE_SECONDS,
            allowed,
        )
    return allowed


async def key_look(credential: bytes, token: str, cluster_id: int) -> bool:
    """``check`` of a key on the event loop (``key_looks``): the same answer, remembered the
    same way. Raises ``psycopg.Error`` when the database does not answer."""
    team_id = _team_remembered(cluster_id)
    if team_id is _UNKNOWN:
        team_id = _team_remember(cluster_id, await key_looks.cluster_team(cluster_id))
    allowed = team_id is not None and _key_passes(await key_looks.api_key(token), team_id)
    if allowed and key_passed(cluster_id, token):
        # A Redis write, in a thread: the loop answers every request of this process.
        asyncio.get_running_loop().run_in_executor(None, seen_now, token)
    return _remember(cluster_id, credential, allowed)


def due_for_a_look(found: tuple[bytes, str] | None, cluster_id: int) -> bool:
    """Whether a remembered answer is in the second half of its time: looked at again then,
    while it still answers, so a credential in steady use never waits for the database (and
    a revoked one is refused as soon as the look comes back)."""
    if found is None:
        return False
    memo = _memo(cluster_id, found[0])
    hit = _remembered.get(memo)
    left = settings.GATEWAY_AUTH_CACHE_SECONDS / 2
    return hit is not None and hit[0] - _now() < left and memo not in _looking


def _bare_request(authorization: str, cookie: str) -> HttpRequest:
    """What ``check`` reads of a sub-request (its credential), without Django's handling."""
    request = HttpRequest()
    request.META["HTTP_AUTHORIZATION"] = authorization
    request.COOKIES = parse_cookie(cookie)
    return request


def first_look(authorization: str, cookie: str, cluster_id: int) -> bool:
    """``check`` outside Django's request handling. The looks share one thread and keep its
    database connection between them (taking one from the pool and giving it back cost as
    much as the look's query). A kept connection may have died meanwhile (the database
    restarted): a look that fails closes it and tries once more on a new one."""
    try:
        return check(_bare_request(authorization, cookie), cluster_id)
    except DatabaseError:
        connection.close()
    return check(_bare_request(authorization, cookie), cluster_id)


def _look_again(authorization: str, cookie: str, cluster_id: int) -> None:
    found = credential_of(authorization, parse_cookie(cookie))
    memo = _memo(cluster_id, found[0])
    try:
        first_look(authorization, cookie, cluster_id)
    finally:
        _looking.discard(memo)


async def _key_look_again(found: tuple[bytes, str], cluster_id: int) -> None:
    try:
        await key_look(found[0], found[1], cluster_id)
    except psycopg.Error:  # the remembered answer stands; the next request looks again
        logger.warning("gateway auth: the database did not answer a look", exc_info=True)
    finally:
        _looking.discard(_memo(cluster_id, found[0]))


def _on_the_loop(found: tuple[bytes, str] | None) -> bool:
    """Whether this credential is looked at on the event loop (a key, on PostgreSQL)."""
    return found is not None and found[0].startswith(b"k") and key_looks.available()


REFUSED_BODY = b'{"detail": "Authentication required."}'
REFUSED_HEADERS = {"Content-Type": "application/json", "WWW-Authenticate": 'Bearer realm="cluster"'}


def _answer(allowed: bool, cluster_id: int) -> HttpResponse:
    if allowed:
        traffic.request_passed(cluster_id)
        return HttpResponse(status=200)
    return HttpResponse(REFUSED_BODY, status=401, headers=REFUSED_HEADERS)


_background: set[asyncio.Task] = set()


class GatewayAuthFastPath:
    """ASGI, in front of Django: a remembered answer goes out without Django's request
    handling (request object, signals, middleware); anything else goes on to Django."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        match = PATH.match(scope["path"]) if scope["type"] == "http" else None
        if match is not None and scope["method"] in ("GET", "HEAD"):
            cluster_id = int(match.group(1))
            authorization, cookie = "", ""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value.decode("latin-1")
                elif name == b"cookie":
                    cookie = value.decode("latin-1")
            found = credential_of(authorization, parse_cookie(cookie))
            answer = remembered_for(found, cluster_id)
            on_the_loop = _on_the_loop(found)
            if answer is not None and due_for_a_look(found, cluster_id):
                _looking.add(_memo(cluster_id, found[0]))
                if on_the_loop:
                    look = _key_look_again(found, cluster_id)
                else:
                    look = sync_to_async(_look_again)(authorization, cookie, cluster_id)
                task = asyncio.ensure_future(look)
                _background.add(task)  # kept until done (the loop holds tasks weakly)
                task.add_done_callback(_background.discard)
            if answer is None and found is not None:
                # A first look (the database): a key's on the loop; anything else in the one
                # thread these looks share, without Django's request handling (a request
                # object, signals, the middleware chain and a thread made for the request
                # cost more than the look itself).
                try:
                    if on_the_loop:
                        answer = await key_look(found[0], found[1], cluster_id)
                    else:
                        answer = await sync_to_async(first_look)(authorization, cookie, cluster_id)
                except (DatabaseError, psycopg.Error):
                    logger.warning("gateway auth: the database did not answer", exc_info=True)
                    await _send(send, 503, [], b"")  # as Django's handler would answer
                    return
            if answer is not None:
                if answer:
                    traffic.request_passed(cluster_id)
                    status, headers, body = 200, [], b""
                else:
                    status, body = 401, REFUSED_BODY
                    headers = [(k.lower().encode(), v.encode()) for k, v in REFUSED_HEADERS.items()]
                await _send(send, status, headers, body)
                return
        await self.app(scope, receive, send)


async def _send(send, status: int, headers: list, body: bytes) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def gateway_auth(request: HttpRequest, cluster_id: int) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405)
    return _answer(request_allowed(request, int(cluster_id)), int(cluster_id))


class GatewayAuthMiddleware:
    """Answers the gateway's sub-requests before the rest of the chain. The web processes
    run the chain in the request's thread (core/asgi_handler.py), where this answers
    what ``GatewayAuthFastPath`` did not remember; in an async chain (Django's own ASGI
    handler) a remembered answer is given on the event loop and only a first look hops to
    the thread to read the database."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        match = PATH.match(request.path_info)
        if match is None:
            return self.get_response(request)
        return gateway_auth(request, int(match.group(1)))

    async def __acall__(self, request: HttpRequest):
        match = PATH.match(request.path_info)
        if match is None:
            return await self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            return HttpResponse(status=405)
        cluster_id = int(match.group(1))
        answer = remembered(request, cluster_id)
        if answer is None:
            # In Django's sync thread, where its database connections are looked after.
            answer = await sync_to_async(request_allowed)(request, cluster_id)
        return _answer(answer, cluster_id)


def forget() -> None:
    """Drop every remembered answer (tests that revoke and check at once)."""
    with _lock:
        _remembered.clear()
        _teams.clear()
