"""Which registries a machine may pull from: never one on the machine's own network (its
loopback, its LAN, its cloud's metadata service), unless its provider allows it. A name is
judged by every address it resolves to; ``resolve`` stands in for DNS, whose answers a test
cannot choose."""

from __future__ import annotations

import socket

import pytest

from hosts.runtime import InvalidContainerSpec, check_registry, registry_refusal


def resolving_to(*addresses: str):
    def resolve(name, port, type=0):  # noqa: A002 - getaddrinfo's own keyword
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, type, 6, "", (a, 0))
            for a in addresses
        ]

    return resolve


def unresolvable(name, port, type=0):  # noqa: A002
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@pytest.fixture(autouse=True)
def _production(settings):
    settings.HOST_ALLOW_LOOPBACK = False
    settings.REGISTRY_ALLOW_LOOPBACK = None


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("127.0.0.1:5000/x:1", "a loopback address"),
        ("127.1/x:1", "a loopback address"),  # the resolver's shorthand for 127.0.0.1
        ("localhost:5000/x:1", "a loopback address"),
        ("registry.localhost/x:1", "a loopback address"),
        ("10.1.2.3/x:1", "a private address"),
        ("172.31.255.1:5000/x:1", "a private address"),
        ("192.168.0.10/x:1", "a private address"),
        ("100.100.1.1/x:1", "a private address"),  # carrier-grade NAT, Tailscale
        ("169.254.169.254/x:1", "a link-local address"),
        ("0.0.0.0:5000/x:1", "an unspecified address"),
    ],
)
def test_registries_on_the_machines_own_network_are_refused(image, why):
    reason = registry_refusal(image, allow_private=False, resolve=unresolvable)
    assert reason is not None and why in reason
    assert registry_refusal(image, allow_private=True, resolve=unresolvable) is None


@pytest.mark.parametrize(
    "addresses",
    [("10.0.0.5",), ("93.184.216.34", "127.0.0.1"), ("fd00::1",), ("fe80::1",), ("::1",)],
)
def test_a_name_resolving_to_the_machines_own_network_is_refused(addresses):
    reason = registry_refusal(
        "registry.example.com/team/model:1", allow_private=False, resolve=resolving_to(*addresses)
    )
    assert reason is not None and "registry.example.com resolves to" in reason


def test_public_registries_and_docker_hub_are_allowed():
    public = resolving_to("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946")
    assert registry_refusal("ghcr.io/org/img:1", allow_private=False, resolve=public) is None
    # Docker Hub is public: not looked up at all (it would fail here).
    assert (
        registry_refusal("pytorch/pytorch:2.3", allow_private=False, resolve=unresolvable) is None
    )
    assert registry_refusal("docker.io/library/busybox", allow_private=False) is None
    # Docker's other name for Docker Hub, the same images: not looked up either.
    assert (
        registry_refusal(
            "index.docker.io/library/busybox", allow_private=False, resolve=unresolvable
        )
        is None
    )


def test_a_name_that_does_not_resolve_is_refused():
    reason = registry_refusal("nowhere.invalid/x:1", allow_private=False, resolve=unresolvable)
    assert reason == "the registry name nowhere.invalid does not resolve"


def test_loopback_follows_host_allow_loopback_unless_registries_say_otherwise(settings):
    settings.HOST_ALLOW_LOOPBACK = True  # tests and make run: registries on loopback
    assert registry_refusal("127.0.0.1:5000/x:1", allow_private=False) is None
    settings.REGISTRY_ALLOW_LOOPBACK = False
    assert registry_refusal("127.0.0.1:5000/x:1", allow_private=False) is not None


def test_the_refusal_names_the_image_field():
    with pytest.raises(InvalidContainerSpec) as caught:
        check_registry("10.0.0.7:5000/team/model:1", allow_private=False)
    assert caught.value.field == "image"
    assert "10.0.0.7:5000 is a private address" in caught.value.reason
    assert "does not allow private registries" in caught.value.reason
