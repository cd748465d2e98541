"""Celery beat entries of the scheduler room (plain data: settings imports this before apps load)."""

from __future__ import annotations

from datetime import timedelta

BEAT_SCHEDULE: dict[str, dict] = {
    "reconcile-machines": {
        "task": "scheduler.tasks.machines_reconcile",
        "schedule": timedelta(seconds=20),
    },
}
