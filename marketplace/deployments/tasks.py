"""Deployments' tasks: a pass over one deployment, over those waiting for capacity, the sweep.

Named ``marketplace.tasks.*`` as they were when they lived in marketplace/tasks.py: the beat
schedule and messages already queued in Redis name them so. Services queue them by name
(``core.task_queue``).
"""

from __future__ import annotations

from celery import shared_task

from marketplace.deployments import reconciler, sweep


@shared_task(name="marketplace.tasks.deployment_reconcile")
def deployment_reconcile(deployment_id: int) -> bool:
    """One reconcile pass over a deployment (woken by an event about it or its machines)."""
    return reconciler.deployment_reconcile(deployment_id=deployment_id)


@shared_task(name="marketplace.tasks.deployments_place_waiting")
def deployments_place_waiting(deployment_ids: list[int]) -> int:
    """Passes over deployments with queued replicas, all at once, when capacity appeared."""
    return sweep.deployments_pass(sorted(deployment_ids))


@shared_task(name="marketplace.tasks.deployments_sweep")
def deployments_sweep() -> int:
    """The beat sweep: catches whatever an event missed (a lost task, capacity freed quietly)."""
    return sweep.deployments_sweep()
