"""Gauges read from the database and the broker at scrape time.

Computed when Prometheus asks, never kept in the process, so every web process reports the
same truth and nothing goes stale. Each family is one grouped query over a small or indexed
set of rows (the ledger check is cached, see ledger_check.py); a dependency that does not
answer makes its families go missing and ``gpumkt_scrape_source_up`` 0, instead of failing
the whole scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import redis
from django.conf import settings
from django.db.models import Count, Sum
from prometheus_client.core import GaugeMetricFamily, Metric

from billing.models import Account, AccountKind
from hosts.models import Gpu, Machine, MachineStatus
from marketplace.celery import app as celery_app
from marketplace.models.deployments import Replica, ReplicaState
from marketplace.observability.ledger_check import ledger_check_recent
from scheduler.models import GpuAllocation, Instance, InstanceState

logger = logging.getLogger(__name__)

MICRO_PER_DOLLAR = 1_000_000
# kombu's Redis transport keeps a queue's prioritized messages in sibling lists named
# queue + "\x06\x16" + step, for its default steps 3, 6 and 9.
PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


def counts_by(queryset, field: str) -> dict[str, int]:
    # Count(field), not Count("pk"): an index holding the field answers without the table.
    return dict(queryset.values(field).annotate(n=Count(field)).values_list(field, "n"))


def machines_by_status() -> Metric:
    family = GaugeMetricFamily("gpumkt_machines", "Machines by status.", labels=["status"])
    counts = counts_by(Machine.objects.all(), "status")
    for status in MachineStatus.values:
        family.add_metric([status], counts.get(status, 0))
    return family


def gpus_by_use() -> Metric:
    """Rented: held by a live allocation. Free: present on an online machine and not held."""
    family = GaugeMetricFamily(
        "gpumkt_gpus", "GPUs rented, and free on online machines.", labels=["state"]
    )
    live = GpuAllocation.objects.filter(released_at=None)
    rented = live.count()
    free = (
        Gpu.objects.filter(present=True, machine__status=MachineStatus.ONLINE)
        .exclude(pk__in=live.values("gpu_id"))
        .count()
    )
    family.add_metric(["rented"], rented)
    family.add_metric(["free"], free)
    return family


def instances_by_state() -> Metric:
    """Every state but destroyed: destroyed rows are history that only grows (most of the
    table on a site that has run a while), and counting them made each scrape slower as the
    site aged, though nothing running had changed."""
    family = GaugeMetricFamily(
        "gpumkt_instances", "Instances by state (destroyed ones not counted).", labels=["state"]
    )
    counts = counts_by(Instance.objects.exclude(state=InstanceState.DESTROYED), "state")
    for state in InstanceState.values:
        if state != InstanceState.DESTROYED:
            family.add_metric([state], counts.get(state, 0))
    return family


def replicas_queued() -> Metric:
    family = GaugeMetricFamily(
        "gpumkt_deployment_replicas_queued",
        "Deployment replicas wanted but not placed (no machine fits yet).",
    )
    family.add_metric([], Replica.objects.filter(state=ReplicaState.QUEUED).count())
    return family


def held_credit() -> Metric:
    family = GaugeMetricFamily(
        "gpumkt_held_credit_dollars", "Credit held for running rentals, all teams together."
    )
    held = Account.objects.filter(kind=AccountKind.HELD).aggregate(s=Sum("balance"))["s"]
    family.add_metric([], (held or 0) / MICRO_PER_DOLLAR)
    return family


def ledger_consistency() -> Iterator[Metric]:
    check = ledger_check_recent()
    consistent = GaugeMetricFamily(
        "gpumkt_ledger_consistent",
        "1 when the last ledger check found every invariant true, else 0.",
    )
    consistent.add_metric([], 1 if check.consistent else 0)
    checked = GaugeMetricFamily(
        "gpumkt_ledger_checked_at_seconds", "When the ledger was last checked (Unix time)."
    )
    checked.add_metric([], check.checked_at)
    took = GaugeMetricFamily(
        "gpumkt_ledger_check_duration_seconds", "How long the last ledger check took."
    )
    took.add_metric([], check.seconds)
    yield from (consistent, checked, took)


def celery_queue_names() -> list[str]:
    names = [celery_app.conf.task_default_queue]
    names.extend(getattr(queue, "name", queue) for queue in celery_app.conf.task_queues or [])
    return list(dict.fromkeys(names))


def queue_lengths() -> Metric:
    """Messages waiting in each Celery queue (Redis LLEN; tasks taken by a worker are not
    counted)."""
    family = GaugeMetricFamily(
        "gpumkt_celery_queue_length", "Tasks waiting in each Celery queue.", labels=["queue"]
    )
    timeout = settings.READINESS_TIMEOUT_SECONDS
    client = redis.Redis.from_url(
        settings.CELERY_BROKER_URL, socket_connect_timeout=timeout, socket_timeout=timeout
    )
    try:
        pipe = client.pipeline(transaction=False)
        names = celery_queue_names()
        prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
        for name in names:
            for suffix in PRIORITY_SUFFIXES:
                pipe.llen(prefix + name + suffix)
        lengths = pipe.execute()
    finally:
        client.close()
    for index, name in enumerate(names):
        step = len(PRIORITY_SUFFIXES)
        family.add_metric([name], sum(lengths[index * step : (index + 1) * step]))
    return family


SOURCES: dict[str, Callable[[], Metric | Iterator[Metric]]] = {
    "machines": machines_by_status,
    "gpus": gpus_by_use,
    "instances": instances_by_state,
    "replicas": replicas_queued,
    "held_credit": held_credit,
    "ledger": ledger_consistency,
    "queues": queue_lengths,
}


class DomainCollector:
    """A prometheus_client collector: every gauge above, read now."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpumkt_scrape_source_up",
            "1 when this scrape could read the source, 0 when it failed.",
            labels=["source"],
        )
        for name, source in SOURCES.items():
            try:
                produced = source()
                families = [produced] if isinstance(produced, Metric) else list(produced)
            except Exception:
                logger.warning("metrics source %s failed", name, exc_info=True)
                up.add_metric([name], 0)
                continue
            up.add_metric([name], 1)
            yield from families
        yield up
