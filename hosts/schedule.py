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
    "host-heartbeats-prune": {
        "task": "hosts.tasks.heartbeats_prune",
        "schedule": timedelta(hours=1),
    },
}
