"""Thin Celery tasks of the billing room: reload, call a service, return."""

from __future__ import annotations

from celery import shared_task

from billing import topups


# Celery ships no type hints: its decorators are untyped.
@shared_task(name="billing.tasks.topups_expire")  # type: ignore[untyped-decorator]
def topups_expire() -> int:
    """Top-ups whose Checkout Session can no longer be paid are marked expired."""
    return topups.topups_expire_stale()
