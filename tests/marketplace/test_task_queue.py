"""Services queue tasks by name (core/task_queue.py) instead of importing the task modules,
which import them. A name is only checked when it is queued, so here every name the code
queues by must be a task registered in the running app, and each call names its task
plainly (a string, so this check can read it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from celery import current_app
from celery.exceptions import NotRegistered

from core.task_queue import task_queue

ROOT = Path(__file__).resolve().parents[2]
APPS = ("marketplace", "billing", "hosts", "scheduler", "core")


def queued_names() -> dict[str, list[str]]:
    """Each name passed to ``task_queue``/``task_queue_on_commit``, and where; a call whose
    name is not a plain string is listed under ``None``."""
    found: dict[str, list[str]] = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if path == ROOT / "core" / "task_queue.py":  # where they are defined
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                    continue
                if node.func.id not in ("task_queue", "task_queue_on_commit"):
                    continue
                first = node.args[0] if node.args else None
                name = first.value if isinstance(first, ast.Constant) else None
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.setdefault(str(name), []).append(where)
    return found


def test_every_task_queued_by_name_is_registered():
    names = queued_names()
    assert "None" not in names, names.get("None")
    assert len(names) >= 6  # the scan found the callers (volumes, bids, reconciler, routes …)
    missing = {name: where for name, where in names.items() if name not in current_app.tasks}
    assert missing == {}


def test_an_unknown_name_is_refused_at_once():
    with pytest.raises(NotRegistered):
        task_queue("marketplace.tasks.no_such_task", 1)


def test_every_task_the_beat_runs_is_registered():
    """Deployments' and clusters' tasks moved beside their concepts under their old names; the
    beat schedule still finds each by name in a worker (which imports the apps' task modules
    as it starts, as here)."""
    from django.conf import settings

    current_app.loader.import_default_modules()

    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"marketplace.tasks.clusters_tick", "marketplace.tasks.deployments_sweep"} <= scheduled
    assert sorted(scheduled - set(current_app.tasks)) == []
