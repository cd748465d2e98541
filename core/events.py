"""Channels group messages, sent after the transaction commits, through one publisher per
process.

Why it exists: a change's live events must never reach a browser if the change rolls back, and
the sender (a request, a Celery task) must not wait for Redis on its way to its answer. So a
send is queued ``on_commit`` and handed to the process's own event loop, which sends batch after
batch in the order they came. Which groups exist and what their messages say is the apps'
(``marketplace.events``); here is only the sending.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import logging
import os
import threading
from collections import defaultdict
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

# A group's name and one message to it.
Message = tuple[str, dict[str, Any]]


def send_on_commit(messages: list[Message], what: str, *, wait: bool = False) -> None:
    """Send on commit; a rolled-back change never reaches a browser. The sender goes on at
    once (the process's publisher sends, in order) unless it must ``wait`` for the send."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            _publisher().send(layer, messages, what, wait=wait)

    transaction.on_commit(send)


# What a sender hands the publisher: the layer, its messages, what they are (for the log), the
# sender's context, and a future set once sent (when the sender waits).
_Batch = tuple[
    BaseChannelLayer,
    list[Message],
    str,
    contextvars.Context,
    "concurrent.futures.Future[None] | None",
]


class _Publisher:
    """An event loop of the process's own, in a daemon thread, sending the events handed to
    it one batch after another, in the order they came: a request or a task hands its events
    over and goes on (a push is best-effort, as before), and one team's events still reach
    its consoles in order.

    ``async_to_sync`` from a thread outside any event loop (a Celery worker, a management
    command) started a thread and an event loop for each send, and the channel layer opened
    a Redis connection for each new loop: CPU and a wait for Redis on every send, three sends
    per rent, all on the way to the rent's answer (bench/rent_to_running.py; figures in
    docs/benchmarks.md). This loop and its connection stay."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        # Bound to ``loop`` at its first use there.
        self.queue: asyncio.Queue[_Batch] = asyncio.Queue()
        threading.Thread(target=self._run, name="events-publisher", daemon=True).start()

    def send(
        self, layer: BaseChannelLayer, messages: list[Message], what: str, *, wait: bool = False
    ) -> None:
        if self.queue.qsize() >= MAX_QUEUED:  # Redis has not answered for a long while
            logger.warning("publisher queue full; %s not sent", what)
            return
        done: concurrent.futures.Future[None] | None = concurrent.futures.Future() if wait else None
        # The sender's context variables (its log context) go along to the send.
        batch: _Batch = (layer, messages, what, contextvars.copy_context(), done)
        self.loop.call_soon_threadsafe(self.queue.put_nowait, batch)
        if done is not None:
            done.result()

    def flush(self, timeout: float) -> None:
        """Wait until what was handed over so far has been sent (at exit)."""
        if self.pid != os.getpid():  # a forked child's copy of its parent's: no thread here
            return
        future = asyncio.run_coroutine_threadsafe(self.queue.join(), self.loop)
        with contextlib.suppress(concurrent.futures.TimeoutError):
            future.result(timeout)

    def _run(self) -> None:
        self.loop.run_until_complete(self._sending())

    async def _sending(self) -> None:
        while True:
            layer, messages, what, context, done = await self.queue.get()
            try:
                await asyncio.create_task(_send_all(layer, messages, what), context=context)
            except Exception:
                logger.exception("could not publish %s", what)
            finally:
                self.queue.task_done()
                if done is not None:
                    done.set_result(None)


# Batches waiting to be sent at most; past it (Redis silent for minutes) events are dropped.
MAX_QUEUED = 10_000

_publisher_now: _Publisher | None = None
_publisher_lock = threading.Lock()


def _publisher() -> _Publisher:
    """The process's publisher, made at its first event."""
    global _publisher_now
    with _publisher_lock:
        if _publisher_now is None:
            _publisher_now = _Publisher()
            atexit.register(_publisher_now.flush, FLUSH_AT_EXIT_SECONDS)
        return _publisher_now


def _forget_publisher() -> None:
    """In a forked child (a Celery pool process) the parent's thread does not exist: the
    child makes its own publisher at its first event."""
    global _publisher_now, _publisher_lock
    _publisher_now, _publisher_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_publisher)


# How long a process that ends waits for its last events to leave.
FLUSH_AT_EXIT_SECONDS = 2.0


async def _send_all(layer: BaseChannelLayer, messages: list[Message], what: str) -> None:
    """Every message in one trip to the event loop (a batch of placements sends thousands),
    to the groups someone listens to where the layer can tell, groups side by side so their
    round trips to Redis overlap; each group's messages in order."""
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for group, message in messages:
        by_group[group].append(message)
    listened = getattr(layer, "groups_listened", None)
    if listened is not None:
        # Only groups someone is in (core.channel_layer): one round trip for all of them.
        try:
            members = await listened(by_group)
        except Exception:  # a push is best-effort, as below
            logger.exception("could not publish %s", what)
            return
        by_group = {group: queue for group, queue in by_group.items() if group in members}
    lanes = asyncio.Semaphore(SEND_LANES)

    async def send_group(group: str, group_messages: list[dict[str, Any]]) -> None:
        async with lanes:
            for message in group_messages:
                try:
                    await layer.group_send(group, message)
                except Exception:  # a push is best-effort; the page reloads state on reconnect
                    logger.exception("could not publish %s to %s", what, group)

    await asyncio.gather(*(send_group(group, queue) for group, queue in by_group.items()))


# Groups sent to at once: enough to hide Redis round trips, few enough not to open a
# connection storm.
SEND_LANES = 32
