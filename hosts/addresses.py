"""Which machine addresses the platform will connect to.

The platform connects wherever a provider points it, from inside its own network, so an
address is a way to reach the platform's neighbours (server-side request forgery). Refused:

- loopback (127.0.0.0/8, ::1, ``localhost``): the platform's own Redis, PostgreSQL and
  sshd live there. Allowed only where ``settings.HOST_ALLOW_LOOPBACK`` is set (DEBUG, the
  tests and the simulated hosts of ``make run``, which are real sshd on loopback addresses);
- link-local (169.254.0.0/16, fe80::/10): cloud metadata services (169.254.169.254) hand out
  credentials there;
- unspecified (0.0.0.0, ::: Linux connects those to the local machine), multicast, and
  reserved ranges: never a GPU machine.

Private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) are allowed: on-premises
providers and VPN overlays (WireGuard, Tailscale) reach their machines there, and an operator
who runs the platform next to other private services should keep its workers' egress
firewalled anyway; the address check is not a firewall.

The check runs twice: on registration (literal addresses and ``localhost`` names, with a
field error) and at every connect, on the addresses the name resolves to *then*, and the
socket connects to exactly the address that was checked (so a name that re-resolves to
127.0.0.1 later, DNS rebinding, is refused too).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
import socket

from django.conf import settings

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressRefused(OSError):
    """The address is one the platform never connects to (see the module's docstring)."""


def loopback_allowed() -> bool:
    return bool(getattr(settings, "HOST_ALLOW_LOOPBACK", settings.DEBUG))


def literal_ip(address: str) -> IPAddress | None:
    """The IP an address spells, in any form the resolver accepts (``127.1``, ``2130706433``,
    ``[::1]``), or None for a host name."""
    text = address.strip().removeprefix("[").removesuffix("]")
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(text)
    try:
        # inet_aton reads the old shorthand forms that getaddrinfo also accepts.
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except (OSError, ValueError):
        return None


def refusal(ip: IPAddress) -> str | None:
    """Why the platform will not connect to ``ip`` (None: it may)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return None if loopback_allowed() else "a loopback address (this platform's own machine)"
    if ip.is_unspecified:
        return "an unspecified address (0.0.0.0 or ::)"
    if ip.is_link_local:
        return "a link-local address (169.254.0.0/16, fe80::/10)"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_reserved:
        return "a reserved address"
    return None


def address_refusal(address: str) -> str | None:
    """Registration's check: literal IPs and ``localhost`` names (no DNS lookup here; the
    connect checks what a name resolves to)."""
    name = address.strip().lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return None if loopback_allowed() else "a loopback address (this platform's own machine)"
    ip = literal_ip(address)
    return refusal(ip) if ip is not None else None


def connect(address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to the first allowed address the name resolves to.

    Raises AddressRefused when any resolved address is refused (a name that mixes a public
    and a loopback record is refused whole), OSError when none answers. The caller turns both
    into one message for the provider, so the platform does not tell open from closed ports.
    """
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise OSError(f"cannot resolve {address!r}: {error}") from error
    for *_, sockaddr in infos:
        reason = refusal(ipaddress.ip_address(sockaddr[0].split("%", 1)[0]))
        if reason is not None:
            raise AddressRefused(f"{address} resolves to {sockaddr[0]}, {reason}")
    last_error: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
        except OSError as error:
            sock.close()
            last_error = error
            continue
        # Commands are small request/response exchanges: without TCP_NODELAY, Nagle's
        # algorithm and delayed ACKs hold each one back for a timer far longer than the
        # exchange itself.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise last_error or OSError(f"{address} resolves to no address")


# One label of a host name (RFC 1123): letters, digits and inner hyphens, at most 63.
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", re.IGNORECASE)
ADDRESS_HINT = "A host name or IP address, like gpu1.example.com or 203.0.113.7"


def address_syntax_problem(address: str) -> str | None:
    """Why ``address`` is not a host name or an IP address (None: it is one). Only the form:
    whether it answers is for the first connection to say."""
    if "://" in address or "/" in address:
        return f"{ADDRESS_HINT}, without a scheme or path (not {address!r})."
    if "@" in address:
        return f"{ADDRESS_HINT}; the SSH user goes in its own field."
    text = address.removeprefix("[").removesuffix("]")
    if ":" in text:
        try:
            ipaddress.IPv6Address(text)
        except ValueError:
            return f"{ADDRESS_HINT}; a port goes in the Port field."
        return None
    name = text.rstrip(".")
    labels = name.split(".")
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            return f"{address} is not an IP address: it has four numbers from 0 to 255."
        return None
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        return f"{ADDRESS_HINT}: letters, digits, hyphens and dots."
    return None
