from __future__ import annotations

import logging

from celery import shared_task

from hosts.runtime import HostKeyMismatch, HostUnreachable
from scheduler import work
from scheduler.services.reconcile import machine_reconcile, machines_needing_reconcile

logger = logging.getLogger(__name__)


@shared_task(name="scheduler.tasks.machines_reconcile")
def machines_reconcile() -> int:
    """Fan out one reconcile per online machine with containers to watch."""
    count = 0
    for machine_id in machines_needing_reconcile().values_list("pk", flat=True):
        machine_reconcile_one.delay(machine_id)
        count += 1
    return count


@shared_task(name="scheduler.tasks.machine_reconcile_one")
def machine_reconcile_one(machine_id: int) -> int:
    try:
        return machine_reconcile(machine_id=machine_id)
    except (HostUnreachable, HostKeyMismatch):
        logger.info("machine %s unreachable; heartbeats will mark it offline", machine_id)
        return 0


@shared_task(name="scheduler.tasks.work_sweep")
def work_sweep() -> int:
    """Queue again launches, stops and destroys that no worker is carrying out."""
    return work.work_sweep()
