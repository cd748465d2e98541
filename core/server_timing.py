"""``Server-Timing: app;dur=…`` on every HTTP answer: how long the process took to answer.

The standard header (W3C Server Timing) that browsers' developer tools show beside a
request's network time, so a renter or an operator reads at once how much of a slow answer
was the server's and how much the network's. The offer search bench judges its budget on it,
as DESIGN.md sets that budget (server-side), and prints the client's own figure beside it.

The duration runs from when uvicorn hands the request to the application (its headers
parsed) to when the answer's head is sent: for every answer of ours the body is whole by
then (core/asgi_handler.py reads a streamed one first), so all that is left out is writing
the bytes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


class ServerTiming:
    """ASGI, outermost for HTTP: adds ``Server-Timing: app;dur=<milliseconds>``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Message, receive: Any, send: Send) -> None:
        started = time.perf_counter()

        async def send_timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                took = (time.perf_counter() - started) * 1000
                header = (b"server-timing", f"app;dur={took:.2f}".encode())
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await self.app(scope, receive, send_timed)
