"""ASGI entry point: HTTP through Django, WebSockets through Channels.

WebSockets pass the origin check (``socket_origin.SameOriginOnly``: scheme, host and port) and
then session authentication; consumers refuse anonymous users before accepting.
"""

from __future__ import annotations

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")

from core.asgi_handler import one_hop_asgi_application  # noqa: E402

# Django's handler, with each request served in one call to a thread the process keeps.
django_asgi_app = one_hop_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from core.fanout import ServerConnection  # noqa: E402
from core.server_timing import ServerTiming  # noqa: E402
from marketplace.clusters.auth import GatewayAuthFastPath  # noqa: E402
from marketplace.routing import websocket_urlpatterns  # noqa: E402
from marketplace.socket_origin import SameOriginOnly  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The cluster gateway's remembered auth answers skip Django's request handling;
        # every answer says how long the process took (Server-Timing).
        "http": ServerTiming(GatewayAuthFastPath(django_asgi_app)),
        # The team feed writes its frames straight to uvicorn's connection where it can.
        "websocket": ServerConnection(
            SameOriginOnly(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)

# What is loaded by now (Django, the apps, their modules and models) lives as long as the
# process: out of the collector's sight, no collection walks it again. Measured under the rent
# bench's 8 clients: the collector's share of a web process's CPU 8.5 % → 2 %, and no full
# collection (docs/benchmarks.md, 2026-12-07, fifth round).
gc.freeze()
