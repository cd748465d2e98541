"""Celery beat entries of the billing room (plain data: settings imports this before apps load)."""

from __future__ import annotations

from datetime import timedelta

BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "billing-topups-expire": {
        "task": "billing.tasks.topups_expire",
        "schedule": timedelta(hours=1),
    },
}
