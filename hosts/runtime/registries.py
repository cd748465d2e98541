"""Image references and the registries they name: which repository and registry an image
reference points at, and the refusal to pull from a registry on the provider's own network
(loopback, link-local, private or unspecified addresses) unless its provider allows it.
"""

from __future__ import annotations

import ipaddress
import socket

from django.conf import settings

from hosts.addresses import literal_ip, loopback_allowed
from hosts.runtime.container_spec import InvalidContainerSpec

# Registries on these ranges are on the provider's own network: a pull from there makes the
# provider's Docker speak to its loopback services, its LAN or its cloud's metadata service.
_SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT, Tailscale


def _registry_loopback_allowed() -> bool:
    """As for machine addresses (HOST_ALLOW_LOOPBACK: tests, ``make run``, whose registries
    are on loopback), unless REGISTRY_ALLOW_LOOPBACK says otherwise."""
    allowed = getattr(settings, "REGISTRY_ALLOW_LOOPBACK", None)
    return loopback_allowed() if allowed is None else bool(allowed)


def _registry_address_refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return None if _registry_loopback_allowed() else "a loopback address (the machine itself)"
    if ip.is_unspecified:
        return "an unspecified address (0.0.0.0 or ::, the machine itself)"
    if ip.is_link_local:
        return "a link-local address (169.254.0.0/16, fe80::/10: cloud metadata services)"
    if ip.is_private or ip in _SHARED_ADDRESS_SPACE:
        return "a private address (the provider's own network)"
    if ip.is_multicast or ip.is_reserved:
        return "a multicast or reserved address"
    return None


def registry_refusal(image: str, *, allow_private: bool, resolve=socket.getaddrinfo) -> str | None:
    """Why the platform will not pull ``image`` on a machine (None: it may).

    Refused: a registry on loopback, link-local, private or unspecified addresses, given as an
    address or as a name resolving to one (any of its addresses), unless the machine's
    provider allows private registries (``allow_private``). Loopback is allowed where
    ``HOST_ALLOW_LOOPBACK`` is set (tests, ``make run``), as for machine addresses, unless
    ``REGISTRY_ALLOW_LOOPBACK`` is set apart. Docker
    Hub is public and not looked up. Checked at rent time and again right before a pull, since
    a name can be pointed elsewhere meanwhile; the host's Docker resolves the name once more
    itself, so this narrows the window and a provider's egress firewall closes it.
    """
    registry = registry_of(image)
    if allow_private or registry == "docker.io":
        return None
    name = registry.rsplit(":", 1)[0] if ":" in registry else registry
    lowered = name.lower().rstrip(".")
    if lowered == "localhost" or lowered.endswith(".localhost"):
        reason = _registry_address_refusal(ipaddress.ip_address("127.0.0.1"))
        return f"the registry {registry} is {reason}" if reason else None
    ip = literal_ip(name)
    if ip is not None:
        reason = _registry_address_refusal(ip)
        return f"the registry {registry} is {reason}" if reason else None
    try:
        infos = resolve(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return f"the registry name {name} does not resolve"
    for *_, sockaddr in infos:
        reason = _registry_address_refusal(ipaddress.ip_address(sockaddr[0].split("%", 1)[0]))
        if reason is not None:
            return f"the registry {registry} resolves to {sockaddr[0]}, {reason}"
    return None


def check_registry(image: str, *, allow_private: bool) -> None:
    """Raise InvalidContainerSpec("image", why) for an image from the provider's own network."""
    reason = registry_refusal(image, allow_private=allow_private)
    if reason is not None:
        raise InvalidContainerSpec(
            "image", f"{reason}; this machine's provider does not allow private registries"
        )


def image_repository(image: str) -> str:
    """The repository an image reference names, without tag or digest, with Docker Hub's
    defaults spelled out: ``pytorch/pytorch:2.3`` → ``docker.io/pytorch/pytorch``."""
    name = image.split("@", 1)[0]
    if name.rfind(":") > name.rfind("/"):
        name = name[: name.rfind(":")]
    if name.startswith("index.docker.io/"):  # Docker's other name for Docker Hub
        name = name.removeprefix("index.")
    if registry_of(name) == "docker.io" and not name.startswith("docker.io/"):
        name = "docker.io/" + (name if "/" in name else f"library/{name}")
    return name


def registry_of(image: str) -> str:
    """The registry host of an image reference (Docker Hub when the first part is no host,
    or ``index.docker.io``, Docker's other name for it)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return "docker.io" if first == "index.docker.io" else first
    return "docker.io"
