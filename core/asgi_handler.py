"""Django's ASGI handler with the request's middleware and view run in one thread hop.

Under ASGI Django builds its middleware chain for the event loop: a middleware that cannot run
there (ours, WhiteNoise's) is entered through ``sync_to_async``, the async-capable ones after it
go back to the loop through ``async_to_sync``, each ``MiddlewareMixin`` in async mode hops to
the request's thread and back for its ``process_request`` and again for ``process_response``,
and so does every ``process_view``; the view (DRF's are sync) hops once more. Every hop is a
future, a context copy and a thread wake-up: measured under the rent bench's eight clients,
the hops took more of a web process's CPU than an API-key ``GET /api/v1/me/``'s own work.

Every view and middleware of ours is sync, so here the chain is built as under WSGI and the
whole of it, view included, runs in one ``sync_to_async`` call, in the request's own thread
(``thread_sensitive``: the one Django gives each request, where its database connection
lives). Behaviour is the same middleware in the same order; what stays on the event loop is
reading the body, the ``request_started`` signal and writing the response, as before.
"""

from __future__ import annotations

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


class OneHopASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def one_hop_asgi_application() -> OneHopASGIHandler:
    """Like ``django.core.asgi.get_asgi_application``, with the one-hop handler."""
    django.setup(set_prefix=False)
    return OneHopASGIHandler()
