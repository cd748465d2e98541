"""Celery beat entries of the hosts room (plain data: settings imports this before apps load)."""

from __future__ import annotations

import os
from datetime import timedelta

BEAT_SCHEDULE: dict[str, dict] = {
    "host-heartbeats": {
        "task": "hosts.tasks.heartbeats",
        "schedule": timedelta(seconds=int(os.environ.get("HOST_HEARTBEAT_SECONDS", "30"))),
    },
    "host-reprobe": {"task": "hosts.tasks.reprobe_all", "schedule": timedelta(hours=6)},
    # Machines due verification (never run, their schedule came, or their hardware changed).
    "host-verifications": {
        "task": "hosts.tasks.verifications_due",
        "schedule": timedelta(minutes=5),
    },
    "host-heartbeats-prune": {
        "task": "hosts.tasks.heartbeats_prune",
        "schedule": timedelta(hours=1),
    },
}
