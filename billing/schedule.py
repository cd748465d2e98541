"""Celery beat entries of the billing room (plain data: settings imports this before apps load)."""

from __future__ import annotations

BEAT_SCHEDULE: dict[str, dict] = {}
