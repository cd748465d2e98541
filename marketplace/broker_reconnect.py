"""How a Celery worker reconnects to Redis after losing it (the worker's ``worker_consumer``).

Celery's consumer retries with kombu's default backoff, 2 s longer after each failed try up to
30 s (2, 4, 6, ... 30), and no setting changes it. After an outage of a minute or more a
worker could stay idle for up to 30 s after Redis is back, while beat queues sweeps again at
once. This consumer tries every second, then every ``BROKER_RETRY_MAX_SECONDS`` (2 s by
default): a worker consumes again at most that long after Redis answers. With
``broker_connection_max_retries`` None it never gives up (Celery's 100 tries would end the
worker in an outage of a few minutes).

Only the worker imports this module (settings name it as a string).
"""

from __future__ import annotations

from functools import partial

from celery.worker.consumer import Consumer
from django.conf import settings


class BrokerConsumer(Consumer):
    def ensure_connected(self, conn):
        # kombu sleeps up to interval_max + interval_start between tries.
        conn.ensure_connection = partial(
            conn.ensure_connection,
            interval_start=1,
            interval_step=1,
            interval_max=max(settings.BROKER_RETRY_MAX_SECONDS - 1, 0),
        )
        return super().ensure_connected(conn)
