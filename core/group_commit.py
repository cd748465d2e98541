"""Group commit: orders that arrive together are served by one call of a batch function, in one
transaction.

A web process serves each request in its own thread. When several of them ask for the same
write at once (eight API clients renting), each would open its own transaction and spend its
own statements, locks and commit, though a batch of orders costs barely more than one (renting
four machines takes the statements of renting one). So the first caller leads: it takes every
order waiting at that moment (its own first), runs the batch function once for them all in a
transaction of its own thread, and hands each caller its outcome. Callers that arrive while a
batch runs wait for it to end; the first of them leads the next batch.

Gathering. Under load the callers a batch just answered tend to come straight back with their
next orders, a few milliseconds apart. A leader that follows a batch (handed over, or arriving
within ``recently`` seconds of one) waits up to ``gather`` seconds for as many orders as may be
coming: the callers just served and those already waiting. It stops waiting once they are
there, so the wait is short when they are quick. A caller with no batch shortly before it
leads at once: an order alone never waits for company.

Outcomes. The batch function returns, in order, each order's outcome: its result, or the
exception that refused that order alone. An exception it raises before its transaction
commits (a database error, a bug one order provokes) must not fail the others with it: each
caller then runs its order again by itself, in its own thread. One raised after the commit (a
follow-up queued ``on_commit`` failing) changes nothing that was written: every caller gets
its outcome, and the error is logged.

Each caller's context variables (its request's log context) travel with its order
(``contexts``), so what the batch function does on an order's behalf can run in that order's
context. A caller already inside a transaction is served alone, in it (under a savepoint): its
order cannot share a transaction its caller may still roll back.

The batch function always runs inside a transaction opened for it (the batch's own, or that
savepoint), so it opens none of its own: a nested ``atomic`` would cost a savepoint and its
release, two round trips a batch.

Off switch. ``enabled`` (read per order, a setting) turned off serves each order alone in a
transaction of its own, as if no other caller were there: the plain path, for telling whether
a fault or a figure comes from the batching.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from django.db import connection, transaction

logger = logging.getLogger(__name__)

Order = TypeVar("Order")

# (orders, their callers' contexts) -> each order's outcome: a result, or the exception to raise
BatchFunction = Callable[[list[Any], list[contextvars.Context]], Sequence[Any]]

# A batch that ended this recently means load: its callers are likely to be coming back.
RECENTLY = 0.1  # seconds


_PENDING = object()  # an outcome not decided yet


class SizeObserver(Protocol):
    def observe(self, amount: float) -> None: ...


@dataclass(eq=False)
class _Waiting(Generic[Order]):
    order: Order
    context: contextvars.Context
    woken: threading.Event = field(default_factory=threading.Event)
    outcome: Any = _PENDING
    lead: bool = False  # this caller leads the next batch
    expect: int = 0  # as leader: how many orders may be about to be queued
    alone: bool = False  # the batch failed before committing: run this order by itself


class GroupCommit(Generic[Order]):
    def __init__(
        self,
        batch: BatchFunction,
        *,
        limit: int = 32,
        gather: Callable[[], float] = lambda: 0.0,
        recently: float = RECENTLY,
        sizes: SizeObserver | None = None,
        enabled: Callable[[], bool] = lambda: True,
    ):
        self._batch = batch
        self._enabled = enabled
        self._limit = limit
        self._gather = gather  # seconds, read when a leader gathers (a setting may change)
        self._recently = recently
        self._sizes = sizes
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._queue: list[_Waiting[Order]] = []
        self._leading = False  # a batch is being gathered or run
        self._last_served = 0  # the size of the last batch, and when it ended
        self._last_ended = -recently

    @property
    def waiting(self) -> int:
        """Orders queued for the next batch (not yet taken by a leader)."""
        with self._lock:
            return len(self._queue)

    def submit(self, order: Order) -> Any:
        """Serve ``order`` (in a batch with those that arrive meanwhile): its result, or raise
        what refused it."""
        if connection.in_atomic_block:
            # Under a savepoint: a batch that fails rolls back to it, and the caller's
            # transaction may go on.
            with transaction.atomic():
                outcomes = self._batch([order], [contextvars.copy_context()])
            return _raised(outcomes[0])
        waiting = _Waiting(order, contextvars.copy_context())
        if not self._enabled():
            self._run([waiting])
            return _raised(waiting.outcome)
        with self._lock:
            self._queue.append(waiting)
            self._arrived.notify_all()
            if not self._leading:
                self._leading = waiting.lead = True
                if time.monotonic() - self._last_ended < self._recently:
                    waiting.expect = self._last_served
        if not waiting.lead:
            waiting.woken.wait()
        if waiting.lead:
            self._lead(waiting)
        elif waiting.alone:
            self._run([waiting])
        return _raised(waiting.outcome)

    def _lead(self, leader: _Waiting[Order]) -> None:
        """Take the queue (after gathering), run it as one batch, hand the lead on, wake the
        batch's callers with their outcomes (or to run alone)."""
        with self._lock:
            self._gather_for(leader.expect)
            batch, self._queue = self._queue[: self._limit], self._queue[self._limit :]
        failure: Exception | None = None
        try:
            self._run(batch)
        except Exception as error:
            failure = error
        finally:
            # Even on the way out of a BaseException: nobody may be left waiting.
            self._hand_over(served=len(batch))
            for waiting in batch:
                if waiting.outcome is _PENDING:
                    if len(batch) == 1:
                        waiting.outcome = failure
                    else:
                        waiting.alone = True
                waiting.woken.set()
        if self._sizes is not None:
            self._sizes.observe(len(batch))
        if leader.alone:
            self._run([leader])

    def _gather_for(self, expected: int) -> None:
        """Wait (the lock released meanwhile) until ``expected`` orders are queued, at most
        ``gather`` seconds."""
        wanted = min(expected, self._limit)
        if len(self._queue) >= wanted:
            return
        deadline = time.monotonic() + self._gather()
        while len(self._queue) < wanted:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._arrived.wait(left)

    def _run(self, batch: list[_Waiting[Order]]) -> None:
        """The batch function for ``batch``, in a transaction of its own; sets each order's
        outcome. Raises only what fails the batch before it commits."""
        committed = False

        def mark_committed() -> None:
            nonlocal committed
            committed = True

        outcomes: list[Any] = []
        try:
            with transaction.atomic():
                transaction.on_commit(mark_committed)  # first, so it runs before any other
                outcomes = list(self._batch([w.order for w in batch], [w.context for w in batch]))
                if len(outcomes) != len(batch):
                    raise ValueError(f"{len(outcomes)} outcomes for {len(batch)} orders")
        except Exception:
            if not committed:
                raise
            logger.exception("a follow-up of a committed batch of %d orders failed", len(batch))
        finally:
            if committed:
                for waiting, outcome in zip(batch, outcomes, strict=True):
                    waiting.outcome = outcome

    def _hand_over(self, *, served: int) -> None:
        """The first caller still waiting leads the next batch, expecting the callers just
        served back with it; with nobody waiting, the next to arrive leads."""
        with self._lock:
            if self._queue:
                self._queue[0].lead = True
                self._queue[0].expect = served + len(self._queue)
                self._queue[0].woken.set()
            else:
                self._leading = False
                self._last_served, self._last_ended = served, time.monotonic()


def _raised(outcome: Any) -> Any:
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
