"""The Celery app. Tasks live in each app's ``tasks.py``; the beat schedule is in settings.

Observability hooks (marketplace/observability/): task metrics recorded by Celery's signals in
whichever process runs a task; in a worker, an exporter for them when ``WORKER_METRICS_PORT``
is set; logs in the project's structured format (Celery's own handlers are not installed),
with the request id of the web request that queued a task carried into it by
django-structlog's boot step.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import celeryd_init, setup_logging, worker_init, worker_process_shutdown
from django_structlog.celery.steps import DjangoStructLogInitStep

from marketplace.observability import task_metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")

app = Celery("marketplace")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Tasks that live beside their concept rather than in an app's tasks.py.
app.autodiscover_tasks(["marketplace.clusters", "marketplace.deployments"])
app.steps["worker"].add(DjangoStructLogInitStep)

task_metrics.connect()


@setup_logging.connect(weak=False)
def logging_from_settings(**_) -> None:
    """Log as the web processes do (JSON or console, LOG_FORMAT) instead of Celery's format."""
    from django.conf import settings

    from marketplace.observability.logs import configure_logging

    configure_logging(settings.LOGGING)


@celeryd_init.connect(weak=False)
def metrics_dir_reset(**_) -> None:
    task_metrics.multiprocess_dir_empty()


@worker_init.connect(weak=False)
def metrics_exporter_start(sender=None, **_) -> None:
    from django.conf import settings

    if settings.WORKER_METRICS_PORT:
        pool = getattr(sender, "pool_cls", "")
        pool_name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
        task_metrics.exporter_start(
            int(settings.WORKER_METRICS_PORT),
            pool="prefork" if "prefork" in pool_name else pool_name,
        )


@worker_process_shutdown.connect(weak=False)
def metrics_child_exited(pid=None, **_) -> None:
    task_metrics.child_exited(pid)
