"""Leased work: launching, stopping and destroying an instance survive a worker that dies.

The work of a transitional state (``WORK_STATES``) is done by whichever worker holds the
instance's lease: a token taken with one conditional UPDATE (only one of two racing workers
gets it) and valid for ``LEASE`` unless renewed. While the work runs, a heartbeat thread renews
it every ``RENEW_EVERY``; a worker killed mid-way stops renewing, so its lease runs out and the
work sweep (``work_due``) queues the work again for another worker. The broker would redeliver
the killed worker's task only after its visibility timeout (hours), so the sweep is what bounds
the delay: a lease plus one sweep period.

The lease also serializes an instance's work: a stop asked for during a launch waits until the
launcher has let go (it notices the state change at its next progress report), so a container
a launch is still making is never left running on GPUs that a stop has given back.
"""

from __future__ import annotations

import contextvars
import logging
import secrets
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from scheduler.models import WORK_STATES, Instance

logger = logging.getLogger(__name__)

# WORK_LEASE_SECONDS (30): how long a dead worker's launch, stop or destroy waits before the
# sweep hands it to another. Shorter recovers sooner but renews more often; the cluster test
# shortens it so a killed worker's launch is taken over in seconds, not a minute.
LEASE = timedelta(seconds=settings.WORK_LEASE_SECONDS)
RENEW_EVERY = LEASE / 3
# A task queued for due work has this long to take its lease before the sweep queues another.
SWEEP_GRACE = LEASE
# Waits between tries of work the host did not confirm: 5 s, 10 s, 20 s … at most 5 minutes.
RETRY_FIRST = 5
RETRY_MAX = 300


def retry_delay(attempts: int) -> int:
    """Seconds to wait after the ``attempts``-th failed try."""
    return min(RETRY_FIRST * 2 ** max(attempts - 1, 0), RETRY_MAX)


def lease_claim(*, instance_id: int, state: str) -> str | None:
    """Take the lease for the work of ``state``: a token, or None when the instance is no
    longer in that state or another worker's lease is still valid."""
    token = secrets.token_hex(8)
    now = timezone.now()
    taken = (
        Instance.objects.filter(pk=instance_id, state=state)
        .filter(Q(lease_expires_at=None) | Q(lease_expires_at__lt=now))
        .update(
            lease_token=token,
            lease_expires_at=now + LEASE,
            attempts=F("attempts") + 1,
            work_due_at=now,
        )
    )
    return token if taken == 1 else None


def lease_renew(*, instance_id: int, token: str) -> bool:
    """Extend the lease; False when it is no longer this token's."""
    renewed = Instance.objects.filter(pk=instance_id, lease_token=token).update(
        lease_expires_at=timezone.now() + LEASE
    )
    return renewed == 1


def lease_release(*, instance_id: int, token: str, retry_in: int | None = None) -> None:
    """Let go of the lease; ``retry_in`` (seconds) records when the work is due again."""
    fields: dict[str, object] = {"lease_token": "", "lease_expires_at": None}
    if retry_in is not None:
        fields["work_due_at"] = timezone.now() + timedelta(seconds=retry_in)
    Instance.objects.filter(pk=instance_id, lease_token=token).update(**fields)


def lease_left(instance_id: int) -> float:
    """Seconds until the current lease runs out (at least 1)."""
    expires = (
        Instance.objects.filter(pk=instance_id).values_list("lease_expires_at", flat=True).first()
    )
    if expires is None:
        return 1.0
    return max((expires - timezone.now()).total_seconds(), 1.0)


class Heartbeat:
    """Renews a lease from a thread until stopped. ``lost`` turns true if a renewal found the
    lease taken by another worker (this one stalled for longer than ``LEASE``)."""

    def __init__(self, instance_id: int, token: str, every: timedelta = RENEW_EVERY):
        self.instance_id, self.token, self.every = instance_id, token, every
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"lease-{token}")

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every.total_seconds()):
                try:
                    if not lease_renew(instance_id=self.instance_id, token=self.token):
                        self.lost = True
                        return
                except Exception:  # a database hiccup: try again at the next beat
                    logger.warning("could not renew lease %s", self.token, exc_info=True)
        finally:
            connection.close()  # this thread's own connection

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def work_due(now: datetime | None = None) -> QuerySet[Instance]:
    """Instances whose work no worker is doing and no queued task is about to do: no valid
    lease, and due for longer than ``SWEEP_GRACE``."""
    now = now or timezone.now()
    return Instance.objects.filter(state__in=WORK_STATES).filter(
        Q(lease_expires_at=None) | Q(lease_expires_at__lt=now),
        Q(work_due_at=None) | Q(work_due_at__lte=now - SWEEP_GRACE),
    )


def work_queued(*, instance_ids: list[int]) -> None:
    """Record that tasks were queued for these instances now (the sweep waits a grace)."""
    Instance.objects.filter(pk__in=instance_ids).update(work_due_at=timezone.now())


# Who queues the work of each state. The room that owns the tasks registers them (marketplace,
# since a launch needs the team's SSH keys and registry login), so this room imports nothing
# upward; services and sweeps queue work through ``work_enqueue`` alone.
Enqueue = Callable[[int, float | None], None]
# Queues one message that carries many instances' work of one state: (state, [[instance id,
# log context], ...]); the task it queues queues each instance's own task (a fan-out).
EnqueueMany = Callable[[str, list[list]], None]
_enqueuers: dict[str, Enqueue] = {}
_fan_out: list[EnqueueMany] = []


def register_worker(state: str, enqueue: Enqueue) -> None:
    _enqueuers[state] = enqueue


def register_fan_out(enqueue_many: EnqueueMany) -> None:
    _fan_out[:] = [enqueue_many]


def work_enqueue(instance_id: int, state: str, *, countdown: float | None = None) -> None:
    """Queue the task that carries out ``state``'s work for the instance."""
    enqueue = _enqueuers.get(state)
    if enqueue is None:
        # The sweep queues it once a worker process has registered the tasks.
        logger.error("no task registered for %s work (instance %s)", state, instance_id)
        return
    enqueue(instance_id, countdown)


def work_enqueue_on_commit(instance_id: int, state: str) -> None:
    """Queue the work once the transaction that made it due has committed, in the context of
    the caller (whose log context the task carries)."""
    context = contextvars.copy_context()
    transaction.on_commit(lambda: context.run(work_enqueue, instance_id, state))


def work_enqueue_many(
    instance_ids: list[int], state: str, log_contexts: list[dict | None] | None = None
) -> None:
    """Queue the work of many instances in one message, which a worker fans out into each
    instance's own task (``work_fan_out``): a sweep placing hundreds of replicas, or rents
    committed together, pay one round trip to the broker instead of one each.
    ``log_contexts``, one for each instance: the log context its task carries (the request
    that rented it); without them, the caller's.

    At least once, as a single task is: the instances were made due (``work_due_at``) in the
    transaction that committed them, so a message lost before or after it was sent (the
    process died, the broker was away) is queued again by ``work_sweep`` after its grace."""
    if len(instance_ids) > 1 and _fan_out:
        contexts = log_contexts or [None] * len(instance_ids)
        _fan_out[0](
            state, [[pk, context] for pk, context in zip(instance_ids, contexts, strict=True)]
        )
    else:
        work_fan_out(
            state,
            [[pk, log_contexts[i] if log_contexts else None] for i, pk in enumerate(instance_ids)],
        )


def work_fan_out(state: str, work: list[list]) -> None:
    """Queue each instance's own task of a ``work_enqueue_many`` message, each in its log
    context ([instance id, context or None for the current one])."""
    for instance_id, log_context in work:
        if log_context is None:
            work_enqueue(instance_id, state)
        else:
            contextvars.Context().run(_enqueue_logged_as, log_context, instance_id, state)


def _enqueue_logged_as(log_context: dict, instance_id: int, state: str) -> None:
    structlog.contextvars.bind_contextvars(**log_context)
    work_enqueue(instance_id, state)


def work_enqueue_many_on_commit(
    instance_ids: list[int], state: str, contexts: list[contextvars.Context] | None = None
) -> None:
    """``work_enqueue_many`` once the transaction has committed. ``contexts``, one for each
    instance: the context whose log context its task carries (default: the caller's)."""
    ids = list(instance_ids)
    if not ids:
        return
    caller = contextvars.copy_context()
    log_contexts: list[dict | None] | None = None
    if contexts is not None:
        log_contexts = [context.run(structlog.contextvars.get_contextvars) for context in contexts]
    transaction.on_commit(lambda: caller.run(work_enqueue_many, ids, state, log_contexts))


def work_sweep() -> int:
    """Queue again the work no worker is doing: a worker died holding its lease, a queued task
    was lost, or a retry is due. Returns how many were queued."""
    due = list(work_due().values_list("pk", "state"))
    work_queued(instance_ids=[pk for pk, _ in due])
    by_state: dict[str, list[int]] = {}
    for pk, state in due:
        by_state.setdefault(state, []).append(pk)
    for state, instance_ids in by_state.items():
        work_enqueue_many(instance_ids, state)
    return len(due)
