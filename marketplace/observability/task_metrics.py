"""Celery task metrics: how many tasks ran, by name and outcome, and how long they took.

Recorded by Celery's own signals where the task runs: ``task_prerun`` notes the start,
``task_postrun`` (which Celery sends after success, failure and retry alike, with the final
``state``) counts the task under its outcome and observes its duration. Eager runs (tests,
``CELERY_TASK_ALWAYS_EAGER``) send the same signals, in the process that ran the task.

How the numbers leave a worker. Workers are separate processes, often on other machines than
the web processes, so the web's ``/metrics`` cannot see them. Each worker *node* (one
``celery worker`` command) serves its own exporter instead, started in the worker's main
process when ``WORKER_METRICS_PORT`` is set, and Prometheus scrapes every node as a target
(as it scrapes every web process). A per-node exporter was chosen over one shared
multiprocess directory for the whole site because a directory cannot span machines.

Inside one node, tasks run in the prefork pool's child processes, whose memory the main
process cannot read. prometheus_client's multiprocess mode bridges that: with
``PROMETHEUS_MULTIPROC_DIR`` set in the worker's environment (a directory for that node alone;
it is emptied when the worker starts), each child writes its samples to files there and the
exporter adds them up. The variable must be in the environment before the process starts,
because prometheus_client chooses its storage when it is first imported. Without it the
exporter serves the main process's own registry, which is right for ``--pool solo`` or
``threads`` and misses the children's tasks under prefork: the worker logs a warning then.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from celery.signals import task_postrun, task_prerun
from prometheus_client import Counter, Histogram

logger = logging.getLogger(__name__)

TASKS = Counter(
    "gpumkt_celery_tasks",
    "Celery tasks that ran, by task name and outcome (succeeded, failed, retried, …).",
    ["task", "outcome"],
)
TASK_SECONDS = Histogram(
    "gpumkt_celery_task_duration_seconds",
    "Wall time of Celery tasks, by task name and outcome.",
    ["task", "outcome"],
    # From a heartbeat's few milliseconds to an image pull of minutes.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
)

# Celery's states, in the words an operator reads.
OUTCOMES = {"SUCCESS": "succeeded", "FAILURE": "failed", "RETRY": "retried"}

_started: dict[str, float] = {}


def task_started(task_id: str | None = None, **_) -> None:
    if task_id:
        _started[task_id] = time.perf_counter()


def task_finished(task_id: str | None = None, task=None, state: str | None = None, **_) -> None:
    started = _started.pop(task_id, None) if task_id else None
    name = getattr(task, "name", None) or "unknown"
    outcome = OUTCOMES.get(state or "", (state or "unknown").lower())
    TASKS.labels(task=name, outcome=outcome).inc()
    if started is not None:
        TASK_SECONDS.labels(task=name, outcome=outcome).observe(time.perf_counter() - started)


def connect() -> None:
    """Record task metrics in this process (weak=False: the receivers are module functions,
    but Celery's signals would drop a bound method of a collected object)."""
    task_prerun.connect(task_started, weak=False)
    task_postrun.connect(task_finished, weak=False)


def multiprocess_dir() -> Path | None:
    value = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(value) if value else None


def multiprocess_dir_empty() -> None:
    """Remove the samples a previous run of this worker left (its children's pids may be
    reused, and counters would carry on from the old files)."""
    directory = multiprocess_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)


def child_exited(pid: int | None = None) -> None:
    """A pool child is gone: its live gauges no longer count (counters stay, summed)."""
    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())


def exporter_start(port: int, *, pool: str = "") -> int:
    """Serve this worker node's metrics over HTTP on ``port``; returns the bound port."""
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
        if pool == "prefork":
            logger.warning(
                "PROMETHEUS_MULTIPROC_DIR is not set: this worker's metrics exporter cannot "
                "see the tasks its prefork children run"
            )
    server, _thread = start_http_server(port, registry=registry)
    bound = server.server_address[1]
    logger.info("worker metrics exporter listening on port %s", bound)
    return bound
