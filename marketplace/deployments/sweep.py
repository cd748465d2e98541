"""The beat sweep: a pass over each deployment that may have work, found by a few set queries.

Events wake the reconciler for the deployments they concern; the sweep catches what an event
missed (a lost task, a worker killed mid-pass, capacity freed quietly). Most deployments are
settled at any moment, and a pass over a settled one reads its replicas, instances and offers
only to change nothing; so the sweep first asks the database which deployments are not
settled, and passes over those alone. A deployment is unsettled when:

- it is active and has queued replicas (capacity may have appeared);
- a placed or running replica's instance says otherwise (launched, exited, failed, ended), or
  its machine is not online;
- an ended replica's rental is not yet being destroyed (a pass ended it and died);
- it is active and its live replicas are not what it wants (scale, a job's next replica or
  its end, a rolling update between steps);
- it is not active and still has live replicas.

Anything else is settled: a pass would find nothing to do.
"""

from __future__ import annotations

import logging

from django.db.models import Count, F, Q
from django.db.models.functions import Greatest, Least

from hosts.models import MachineStatus
from marketplace.deployments.placing import Fleet
from marketplace.deployments.reconciler import (
    ENDED_REPLICA_STATES,
    deployment_reconcile,
    deployments_reconcile,
)
from marketplace.models import Deployment, Replica
from marketplace.models.deployments import (
    LIVE_REPLICA_STATES,
    DeploymentMode,
    DeploymentState,
    ReplicaState,
)
from scheduler.models import InstanceState

logger = logging.getLogger(__name__)


def deployments_unsettled() -> set[int]:
    """Ids of the deployments a pass may change (see the module's list)."""
    return {*_with_replicas_out_of_step(), *_with_counts_out_of_step()}


def deployments_sweep(*, every: bool = False) -> int:
    """Passes over every unsettled deployment (``every``: over every deployment, settled or
    not); returns how many changed."""
    if every:
        return deployments_pass(
            list(Deployment.objects.order_by("pk").values_list("pk", flat=True))
        )
    return deployments_pass(sorted(deployments_unsettled()))


def deployments_pass(deployment_ids: list[int]) -> int:
    """Passes over these deployments, ``CHUNK`` to a transaction, their queued replicas placed
    together over one snapshot of the fleet; returns how many changed. A deployment another
    worker is reconciling now is skipped: that pass sees it. A chunk that fails is passed over
    again one deployment at a time, so one broken deployment does not starve the others."""
    changed = 0
    fleet = Fleet.whole()  # read only if some replica is to be placed
    for start in range(0, len(deployment_ids), CHUNK):
        chunk = deployment_ids[start : start + CHUNK]
        try:
            changed += deployments_reconcile(chunk, fleet=fleet)
        except Exception:
            logger.exception("reconciling deployments %s to %s failed", chunk[0], chunk[-1])
            changed += _one_by_one(chunk)
    return changed


# Deployments to a transaction: enough that placing a backlog rents hundreds of replicas per
# statement, few enough that a chunk's locks are held for well under a second.
CHUNK = 50


def _one_by_one(deployment_ids: list[int]) -> int:
    changed = 0
    for deployment_id in deployment_ids:
        try:
            changed += deployment_reconcile(deployment_id=deployment_id, wait=False)
        except Exception:
            logger.exception("reconciling deployment %s failed", deployment_id)
    return changed


def _with_replicas_out_of_step():
    in_step = Q(state=ReplicaState.PLACED, instance__state=InstanceState.LAUNCHING) | Q(
        state=ReplicaState.RUNNING, instance__state=InstanceState.RUNNING
    )
    placed_out_of_step = Q(state__in=(ReplicaState.PLACED, ReplicaState.RUNNING)) & (
        ~in_step | ~Q(instance__machine__status=MachineStatus.ONLINE)
    )
    rental_left_over = Q(state__in=ENDED_REPLICA_STATES, instance__isnull=False) & ~Q(
        instance__state__in=(InstanceState.DESTROYING, InstanceState.DESTROYED)
    )
    queued_and_active = Q(state=ReplicaState.QUEUED, deployment__state=DeploymentState.ACTIVE)
    live_but_inactive = Q(state__in=LIVE_REPLICA_STATES) & ~Q(
        deployment__state=DeploymentState.ACTIVE
    )
    return (
        Replica.objects.filter(
            placed_out_of_step | rental_left_over | queued_and_active | live_but_inactive
        )
        .values_list("deployment_id", flat=True)
        .distinct()
    )


def _with_counts_out_of_step():
    """Active deployments whose live replicas are not what they want: a replica set's count,
    or a job's min(parallelism, completions left) — and jobs that reached their end."""
    live = Count("replicas", filter=Q(replicas__state__in=LIVE_REPLICA_STATES))
    succeeded = Count("replicas", filter=Q(replicas__state=ReplicaState.SUCCEEDED))
    failed = Count("replicas", filter=Q(replicas__state=ReplicaState.FAILED))
    active = Deployment.objects.filter(state=DeploymentState.ACTIVE).annotate(
        live=live, succeeded=succeeded, failed=failed
    )
    replica_sets = active.filter(mode=DeploymentMode.REPLICASET).exclude(live=F("replica_count"))
    job_wants = Greatest(Least(F("replica_count"), F("completions") - F("succeeded")), 0)
    jobs = active.exclude(mode=DeploymentMode.REPLICASET).filter(
        ~Q(live=job_wants) | Q(succeeded__gte=F("completions")) | Q(failed__gt=F("backoff_limit"))
    )
    return [*replica_sets.values_list("pk", flat=True), *jobs.values_list("pk", flat=True)]
