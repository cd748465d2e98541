"""Keeping a deployment at its count, and what a host that stops answering changes in it.

A machine that stops answering is no proof that its containers died: its replicas' instances
are ``unknown`` and the replicas are kept (``deciding.replica_state_for``) for
``REPLICA_UNREACHABLE_GRACE_MINUTES``. A replica set must keep its count serving meanwhile,
so its **unreachable** replicas are set aside: they are neither counted nor stopped, and
surge replicas are queued in their place (placed where there is room). When the host answers
within the grace, the unreachable replicas count again and the surplus is scaled down,
newest first (the surge replicas); past the grace they are lost and destroyed, and the surge
replicas are simply the set. A job does not surge: running its work twice is no way to keep
a service up, so its unreachable replicas count as live until they are lost.

Pure planners over the pass's replicas, like ``rolling.plan_roll``: the reconciler applies
what they return under the deployment's row lock.
"""

from __future__ import annotations

from marketplace.deployments.rolling import SCALED_DOWN, RollPlan, queued_first_then_newest
from marketplace.models import Deployment, Replica
from marketplace.models.deployments import DeploymentMode
from scheduler.models import InstanceState


def unreachable(replica: Replica) -> bool:
    """A placed replica whose host does not answer (its instance is unknown). Past the grace
    the pass has already ended it, so a live one is always within it."""
    return replica.instance is not None and replica.instance.state == InstanceState.UNKNOWN


def serving(deployment: Deployment, live: list[Replica]) -> list[Replica]:
    """The live replicas that count towards what the deployment wants: a replica set's, less
    the unreachable ones (surged past); a job's, all."""
    if deployment.mode != DeploymentMode.REPLICASET:
        return live
    return [r for r in live if not unreachable(r)]


def plan_scale(counted: list[Replica], wanted: int) -> RollPlan:
    """Queue replicas up to what is wanted, or stop the extras: queued ones first, then the
    newest placed ones. ``counted``: the live replicas that count (``serving``); the rest are
    left as they are."""
    plan = RollPlan()
    if len(counted) < wanted:
        plan.queue = wanted - len(counted)
    for replica in queued_first_then_newest(counted)[: max(len(counted) - wanted, 0)]:
        plan.stop.append((replica, SCALED_DOWN))
    return plan
