"""Clusters' tasks: the gateway's routes, and the beat's look at clusters.

Named ``marketplace.tasks.*`` as they were when they lived in marketplace/tasks.py: the beat
schedule and messages already queued in Redis name them so. Services queue them by name
(``core.task_queue``).
"""

from __future__ import annotations

from celery import shared_task

from marketplace.clusters import autoscale, routes, services


@shared_task(name="marketplace.tasks.gateway_routes_write", bind=True, max_retries=60)
def gateway_routes_write(self) -> bool:
    """Give the gateway the clusters' routes; tried again each second while it is down or a
    new replica does not answer yet (the beat runs it too, mending a restarted gateway)."""
    if routes.routes_push():
        return True
    if self.request.called_directly or self.request.is_eager:
        return False
    raise self.retry(countdown=1)


@shared_task(name="marketplace.tasks.clusters_tick")
def clusters_tick() -> int:
    """The beat's look at clusters: end those whose time is over, autoscale the rest."""
    return services.clusters_end_expired() + autoscale.clusters_autoscale()
