"""Which pages may open the console's WebSockets: the site's own origin, exactly.

The browser sends every WebSocket handshake with the Origin of the page that opened it, and
sends the session cookie whatever that page is; so the origin is the only thing telling our
console from another site. Channels' ``AllowedHostsOriginValidator`` compares the host name
alone: ``http://127.0.0.1:9999`` (anything else listening on the machine), another scheme or
another port of an allowed host all passed. Here the Origin's scheme, host and port must be
those the socket itself was opened at (its Host header and scheme: ``wss`` behind TLS, which
uvicorn learns from the proxy's X-Forwarded-Proto), with the host in ``ALLOWED_HOSTS``; or be
listed in ``CSRF_TRUSTED_ORIGINS``, the same list Django's CSRF check trusts.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import is_same_domain, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(text: str) -> tuple[str, str, int] | None:
    """``scheme://host[:port]`` as (scheme, host, port), or None if it is not one."""
    try:
        parts = urlsplit(text.strip().lower())
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:  # a port that is not a number, or out of range
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or port is None:
        return None
    return parts.scheme, parts.hostname, port


def _trusted(origin: tuple[str, str, int]) -> bool:
    """Listed in CSRF_TRUSTED_ORIGINS (``https://*.example.com`` covering its subdomains)."""
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        wildcard = "://*." in entry
        trusted = _origin(entry.replace("://*.", "://", 1))
        if trusted is None:
            continue
        pattern = "." + trusted[1] if wildcard else trusted[1]
        if trusted[0] == scheme and trusted[2] == port and is_same_domain(host, pattern):
            return True
    return False


def origin_allowed(scope: dict) -> bool:
    headers = dict(scope.get("headers") or [])
    try:
        origin = _origin(headers.get(b"origin", b"").decode("latin1"))
        host_header = headers.get(b"host", b"").decode("latin1")
    except UnicodeDecodeError:  # pragma: no cover - latin1 decodes any bytes
        return False
    if origin is None:
        return False  # browsers always send one; a socket without it is not our page's
    if _trusted(origin):
        return True
    secure = scope.get("scheme") in ("wss", "https")
    own = _origin(f"{'https' if secure else 'http'}://{host_header}")
    return own == origin and validate_host(origin[1], settings.ALLOWED_HOSTS)


class SameOriginOnly:
    """ASGI middleware: a WebSocket from another origin is refused at the handshake."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
