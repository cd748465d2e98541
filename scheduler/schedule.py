"""Celery beat entries of the scheduler room (plain data: settings imports this before apps load)."""

from __future__ import annotations

from datetime import timedelta

BEAT_SCHEDULE: dict[str, dict] = {
    "reconcile-machines": {
        "task": "scheduler.tasks.machines_reconcile",
        "schedule": timedelta(seconds=20),
    },
    # With a 30 s lease and a 30 s grace for queued tasks, a launch, stop or destroy whose
    # worker died is queued again within about a minute.
    "work-sweep": {"task": "scheduler.tasks.work_sweep", "schedule": timedelta(seconds=15)},
}
