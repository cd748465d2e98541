"""Django's ASGI handler with each request served in one call to a thread the process keeps.

Under ASGI Django builds its middleware chain for the event loop: a middleware that cannot run
there (ours, WhiteNoise's) is entered through ``sync_to_async``, the async-capable ones after it
go back to the loop through ``async_to_sync``, each ``MiddlewareMixin`` in async mode hops to
the request's thread and back for its ``process_request`` and again for ``process_response``,
and so does every ``process_view``; the view (DRF's are sync) hops once more. Every hop is a
future, a context copy and a thread wake-up: measured under the rent bench's eight clients,
the hops took more of a web process's CPU than an API-key ``GET /api/v1/me/``'s own work.

Every view and middleware of ours is sync, so here the chain is built as under WSGI, and the
whole of a request's sync work (the ``request_started`` signal, the request object, the chain
and view, reading a streamed body, closing the response, which ends the request) runs in one
call to a thread from a pool the process keeps, as a threaded WSGI server does. Django's own
handler made a thread for every request and joined it at the end (``ThreadSensitiveContext``):
with ``/healthz``, which does nothing, that was most of a request's 1.8 ms (bench's web
process, 2026-12-06). Reading the body and writing the answer stay on the event loop.

The response is closed before it is written, so its database connection goes back to the pool
before the bytes go out (under WSGI it goes back after); a streamed body is read whole in the
request's thread first, as Django's handler did for every synchronous stream.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import django
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse, HttpResponseBase
from django.urls import set_script_prefix

# Requests one web process serves at once; more wait for a thread. Above the database pool's
# 20 connections (``DB_POOL_MAX``): requests that touch no database (health checks, static
# files, remembered gateway answers) are not held behind those that wait for one.
REQUEST_THREADS = 32


class OneHopASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self.threads = ThreadPoolExecutor(REQUEST_THREADS, thread_name_prefix="request")

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        # Each request in a copy of the loop's context, as ``sync_to_async`` gives it: its
        # log context and activated settings never reach the next request on that thread.
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        try:
            response = await loop.run_in_executor(
                self.threads, context.run, self.respond, scope, body_file
            )
        finally:
            body_file.close()
        await self.send_response(response, send)

    def respond(self, scope: dict[str, Any], body_file: Any) -> HttpResponseBase:
        """The request's answer, closed (its body read), in the request's thread."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        response: Any
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
            response._handler_class = self.__class__
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        try:
            if response.streaming:
                # Read here, where the stream's database connection is; written from the loop.
                response.streaming_content = _replay(list(response))
        finally:
            response.close()  # the request ends: ``request_finished``, its connection back
        return cast(HttpResponseBase, response)


async def _replay(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def one_hop_asgi_application() -> OneHopASGIHandler:
    """Like ``django.core.asgi.get_asgi_application``, with the one-hop handler."""
    django.setup(set_prefix=False)
    return OneHopASGIHandler()
