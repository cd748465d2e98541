"""Queue a Celery task by its name.

Why it exists: a service that queues follow-up work (resume a rental, remove a volume on its
host, wake a deployment, push the gateway's routes) would otherwise import the module that
defines the task, and that module imports the service to run it: an import cycle, closed by
imports hidden inside functions. A task's name is already its address (the beat schedule and
the messages in Redis carry it), so a caller names the task and only the task module imports
the services, one way. The apps import their task modules when Django starts, so every
process that can queue (a web process included) has them registered; an unknown name raises
Celery's ``NotRegistered``.

Queued through the task object, so ``CELERY_TASK_ALWAYS_EAGER`` (the tests) still runs it in
place, as ``.delay`` would (``send_task`` would not).
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from django.db import transaction


def task_queue(name: str, *args: Any, countdown: float | None = None) -> None:
    """Queue the task called ``name`` with ``args``, after ``countdown`` seconds if given."""
    current_app.tasks[name].apply_async(args, countdown=countdown)


def task_queue_on_commit(name: str, *args: Any) -> None:
    """Queue it once the current transaction commits (not at all if it rolls back)."""
    transaction.on_commit(lambda: task_queue(name, *args))
