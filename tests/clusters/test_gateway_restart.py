"""A gateway that comes back with none of our config (Caddy killed and started again from its
boot file, or reloaded from a Caddyfile) is healed by the next route push, with no one running
``gateway_load`` by hand."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from marketplace.clusters import routes
from scheduler import gateway as gw

pytestmark = pytest.mark.django_db(transaction=True)


def serves(url: str) -> bool:
    """Whether something answers HTTP at ``url`` (any status)."""
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    "came_back_with",
    ["its boot file (the admin API only)", "an HTTP app with another server"],
)
def test_a_route_push_puts_the_gateway_server_back(gateway, settings, came_back_with):
    admin = gw.CaddyAdmin(gateway.admin)
    settings.GATEWAY_LISTEN = f"127.0.0.1:{gateway.listen}"
    restarted: dict = {"admin": {"listen": gateway.admin}}
    if came_back_with.startswith("an HTTP app"):
        restarted["apps"] = {"http": {"servers": {"site": {"listen": ["127.0.0.1:0"]}}}}
    admin.load(restarted)
    assert not serves(gateway.url)
    with pytest.raises(gw.GatewayUnavailable):  # what every push met before: 400
        admin.routes(settings.GATEWAY_SERVER)

    routes.routes_push()

    config = json.loads(admin._call("GET", "/config/"))
    server = config["apps"]["http"]["servers"][settings.GATEWAY_SERVER]
    assert server["listen"] == [settings.GATEWAY_LISTEN]
    assert admin.routes(settings.GATEWAY_SERVER) is not None
    assert serves(gateway.url)
    if came_back_with.startswith("an HTTP app"):
        assert "site" in config["apps"]["http"]["servers"]  # what else it serves stays
    assert config["admin"]["listen"] == gateway.admin
