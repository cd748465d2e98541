"""The deployment reconciler: one level-triggered pass over one deployment (the beat sweep that
finds the deployments needing one is ``sweep.py``).

A pass compares what the deployment wants with what its replicas' instances show, and acts:
replicas follow their instances; an ended replica's rental is destroyed (an elastic
container's data goes when it stops); replicas that no longer meet changed conditions (or a
job's changed spec) are replaced; a replica set rolls to a changed spec, a new replica running
before an old one stops (``rolling``); the number of live replicas is brought to what is
wanted (new ones queued, the newest extras stopped; replicas whose host does not answer are
kept and surged past: ``scaling``); queued replicas are placed as rentals. Anything can wake
a pass (an instance's state, a machine's status or listing, the beat sweep); a pass that
finds nothing to do writes nothing and wakes nothing.

A pass observes (``_Reads``), decides (``deciding.decide``, pure: the rules are there), then
applies what was decided (``_apply``), places what is queued, and finishes (``_finish``).

Safe with many workers: the whole pass runs in one transaction holding the deployment's row
lock, so two passes over one deployment never interleave and never count the same live
replicas twice (never more than wanted); ``rental_create`` locks each machine and allocates
GPUs under database constraints (never a GPU twice). A worker killed mid-pass rolls the pass
back whole (rentals, holds and replica rows included; launches are queued only on commit), so
the next pass starts from what was committed.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from core.task_queue import task_queue_on_commit
from marketplace.deployments import rolling, scaling
from marketplace.deployments.conditions import spec_hash
from marketplace.deployments.deciding import (
    ENDED_REPLICA_STATES,
    RECENT_FAILURES,
    Decision,
    Observed,
    decide,
    failure_backoff,
    roll_in_place,
    wanted_of,
)
from marketplace.deployments.placing import Fleet, Placing, place_queued
from marketplace.models import Deployment, Replica
from marketplace.models.deployments import LIVE_REPLICA_STATES, DeploymentState, ReplicaState
from marketplace.models.rentals import all_free_offers
from marketplace.rentals.actions import rental_destroy_request
from scheduler.models import Instance, InstanceState

logger = logging.getLogger(__name__)

R = ReplicaState
GONE_INSTANCE_STATES = (InstanceState.DESTROYING, InstanceState.DESTROYED)

# Who hears that a replica started running or ended (the cluster gateway's routes): called in
# the pass's transaction, before an ended replica's rental is destroyed, so a hook's on-commit
# work runs before the destroy is queued.
replica_service_hooks: list[Callable[[Replica], None]] = []


def deployment_reconcile(*, deployment_id: int, wait: bool = True) -> bool:
    """One pass over the deployment; True when it changed anything.

    ``wait=False`` skips a deployment another worker is reconciling right now: that pass sees
    the same state. Events wait for the lock, since the pass under way may have read the
    deployment before the event's change.
    """
    with transaction.atomic():
        locked = Deployment.objects.select_for_update(skip_locked=not wait, of=("self",))
        deployment = locked.select_related("team").filter(pk=deployment_id).first()
        if deployment is None:
            return False
        return reconcile_locked(deployment)


def deployments_reconcile(deployment_ids: list[int], *, fleet: Fleet) -> int:
    """Passes over many deployments in one transaction, their queued replicas placed together
    over ``fleet`` (the sweep's); returns how many changed. Deployments another worker is
    reconciling now are skipped."""
    with transaction.atomic():
        deployments = list(
            Deployment.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("team")
            .filter(pk__in=deployment_ids)
            .order_by("pk")
        )
        return sum(reconcile_many_locked(deployments, fleet=fleet))


def reconcile_locked(deployment: Deployment) -> bool:
    """The pass itself; the caller holds the deployment's row lock in a transaction."""
    [changed] = reconcile_many_locked([deployment], fleet=None)
    return changed


def reconcile_many_locked(deployments: list[Deployment], *, fleet: Fleet | None) -> list[bool]:
    """Passes over locked deployments: each observes and decides what it wants, then all
    their queued replicas are placed at once (over ``fleet``, or the offers matching a lone
    deployment's conditions), then each finishes. Returns whether each changed anything."""
    reads = _Reads.of(deployments)
    passes = [_pass(deployment, reads) for deployment in deployments]
    placings = [p.placing for p in passes if p.placing is not None]
    if placings:
        place_queued(placings, fleet or Fleet.matching(placings[0].deployment))
    return [_finish(p) for p in passes]


@dataclass(eq=False)
class _Pass:
    deployment: Deployment
    changed: bool = False
    current: str = ""
    rolling: bool = False
    readiness: str = ""  # what a new replica must do to replace an old one (rolling.readiness)
    placing: Placing | None = None
    reason: str = ""


@dataclass
class _Reads:
    """What passes over many deployments read together before any of them changes anything,
    a query each: their live replicas, which of them have ended replicas whose rentals are
    still up, their recent failures (newest first), and the active jobs' replicas by state.
    A pass that changes something reads its own again."""

    live: dict[int, list[Replica]]
    leftovers: set[int]
    failures: dict[int, list[tuple[datetime, str]]]
    counts: dict[int, dict[str, int]]

    @classmethod
    def of(cls, deployments: list[Deployment]) -> _Reads:
        by_pk = {deployment.pk: deployment for deployment in deployments}
        live: dict[int, list[Replica]] = defaultdict(list)
        for replica in _live_replicas().filter(deployment_id__in=by_pk):
            replica.deployment = by_pk[replica.deployment_id]
            live[replica.deployment_id].append(replica)
        leftovers = set(
            _leftover_instances()
            .filter(replica__deployment_id__in=by_pk)
            .values_list("replica__deployment_id", flat=True)
        )
        failures: dict[int, list[tuple[datetime, str]]] = defaultdict(list)
        rows = _recent_failures().filter(deployment_id__in=by_pk)
        for deployment_id, ended_at, reason in rows.values_list(
            "deployment_id", "ended_at", "reason"
        ):
            failures[deployment_id].append((ended_at, reason))
        jobs = [d.pk for d in deployments if d.is_job and d.state == DeploymentState.ACTIVE]
        counts: dict[int, dict[str, int]] = {pk: dict.fromkeys(R.values, 0) for pk in jobs}
        if jobs:
            grouped = Replica.objects.filter(deployment_id__in=jobs).values_list(
                "deployment_id", "state"
            )
            for deployment_id, state, n in grouped.annotate(n=Count("pk")).order_by():
                counts[deployment_id][state] = n
        return cls(live=live, leftovers=leftovers, failures=failures, counts=counts)

    def observed(self, deployment: Deployment) -> Observed:
        """What one pass decides on. The roll's readiness is read only where replicas run an
        old spec (one query, for a cluster's)."""
        live = self.live[deployment.pk]
        current = spec_hash(deployment)
        rolling_now = deployment.state == DeploymentState.ACTIVE and rolling.old_replicas(
            deployment, live, current
        )
        return Observed(
            deployment=deployment,
            live=live,
            now=timezone.now(),
            grace=unreachable_grace(),
            spec=current,
            counts=self.counts.get(deployment.pk, {}),
            failures=self.failures[deployment.pk],
            readiness=rolling.readiness(deployment) if rolling_now else "",
        )


def _pass(deployment: Deployment, reads: _Reads) -> _Pass:
    """A pass up to placing: decide on what was observed, apply it, and say what is left
    queued to be placed."""
    observed = reads.observed(deployment)
    decision = decide(observed)
    this = _Pass(deployment, current=observed.spec, reason=decision.reason)
    this.rolling, this.readiness = decision.rolling, decision.readiness
    this.changed, live = _apply(
        deployment, decision, observed.now, deployment.pk in reads.leftovers
    )
    if decision.place:
        queued = [r for r in live if r.state == R.QUEUED]
        avoid = {r.instance.machine_id for r in live if r.instance is not None}
        this.placing = Placing(deployment, queued, avoid=avoid, spec=this.current)
    return this


def _apply(
    deployment: Deployment, decision: Decision, now: datetime, leftovers: bool
) -> tuple[bool, list[Replica]]:
    """Write what was decided: replicas follow their instances, a job settles, replicas end,
    new ones are queued, and ended replicas' rentals are destroyed (what ended stops before
    anything new is placed: a surge of one, not two). Returns whether anything changed, and
    the live replicas now."""
    for change in decision.follows:
        replica = change.replica
        if change.state in ENDED_REPLICA_STATES:
            replica.exit_code = change.exit_code
            _replica_ended(replica, change.state, change.reason, now)
            continue
        if change.state == R.RUNNING and replica.started_at is None:
            replica.started_at = now
        replica.save(update_fields=["state", "started_at"])
        if change.state == R.RUNNING:
            _tell_hooks(replica)
    if decision.settled:
        deployment.state = decision.settled
        deployment.save(update_fields=["state", "updated_at"])
    for change in decision.ends:
        _replica_ended(change.replica, change.state, change.reason, now)
    if deployment.state != DeploymentState.ACTIVE:
        return decision.changed, []  # ``_finish`` destroys the rentals
    if decision.queue:
        Replica.objects.bulk_create([Replica(deployment=deployment) for _ in range(decision.queue)])
    written = bool(decision.ends or decision.queue)
    if decision.changed or leftovers:
        written |= _destroy_ended_rentals(deployment)
    live = _live(deployment) if written else decision.live
    return decision.changed or written, live


def _finish(this: _Pass) -> bool:
    """The rest of a pass after placing: a roll that found no room replaces in place, ended
    replicas' rentals are destroyed, and the deployment says why replicas wait."""
    deployment = this.deployment
    if this.placing is not None:
        this.changed |= this.placing.placed > 0
        this.reason = this.placing.reason
    ended_now = deployment.state != DeploymentState.ACTIVE
    if this.rolling:
        rolled, this.reason = _roll_in_place(deployment, this.current, this.reason)
        this.changed |= rolled
        ended_now |= rolled
        if not this.reason and this.readiness:
            live = _live(deployment)
            old = rolling.old_replicas(deployment, live, this.current)
            this.reason = rolling.readiness_wait(live, old, this.readiness)
    if ended_now:
        this.changed |= _destroy_ended_rentals(deployment)
    if this.reason != deployment.queue_reason:
        deployment.queue_reason = this.reason
        deployment.save(update_fields=["queue_reason", "updated_at"])
        this.changed = True
    return this.changed


# --- observing ------------------------------------------------------------------------------


def unreachable_grace() -> timedelta:
    """How long a replica whose host does not answer is kept before it counts as lost."""
    return timedelta(minutes=settings.REPLICA_UNREACHABLE_GRACE_MINUTES)


def replica_end(replica: Replica, state: str, reason: str) -> bool:
    """Mark a live replica ended (final). Its rental is destroyed by ``_destroy_ended_rentals``
    in the same pass."""
    if replica.state in ENDED_REPLICA_STATES:
        return False
    _replica_ended(replica, state, reason, timezone.now())
    return True


def _replica_ended(replica: Replica, state: str, reason: str, now: datetime) -> None:
    replica.state = state
    replica.reason = reason[:300]
    replica.ended_at = now
    replica.save(update_fields=["state", "reason", "exit_code", "ended_at"])
    _tell_hooks(replica)


def _tell_hooks(replica: Replica) -> None:
    for hook in replica_service_hooks:
        hook(replica)


def _destroy_ended_rentals(deployment: Deployment) -> bool:
    """Every ended replica's rental is destroyed, so its money and GPUs stop. A query, not a
    list of what this pass ended: it also finishes what a killed worker left."""
    changed = False
    for instance in _leftover_instances().filter(replica__deployment=deployment):
        rental_destroy_request(
            instance=instance, reason=f"Replica {instance.replica.state}: {instance.replica.reason}"
        )
        changed = True
    return changed


def _leftover_instances():
    """Instances of ended replicas not yet being destroyed."""
    return (
        Instance.objects.filter(replica__state__in=ENDED_REPLICA_STATES)
        .exclude(state__in=GONE_INSTANCE_STATES)
        .select_related("replica")
    )


# --- wanting --------------------------------------------------------------------------------


def replica_counts(deployment: Deployment) -> dict[str, int]:
    counts = dict.fromkeys(R.values, 0)
    grouped = deployment.replicas.values_list("state").annotate(n=Count("pk")).order_by()
    for state, count in grouped:
        counts[state] = count
    return counts


def wanted_live(deployment: Deployment) -> int:
    """How many replicas should be live (queued, placed or running) now."""
    if not deployment.is_job or deployment.state != DeploymentState.ACTIVE:
        return wanted_of(deployment, 0)
    return wanted_of(deployment, replica_counts(deployment)[R.SUCCEEDED])


def _live(deployment: Deployment) -> list[Replica]:
    return list(_live_replicas().filter(deployment=deployment))


def _live_replicas():
    return (
        Replica.objects.filter(state__in=LIVE_REPLICA_STATES)
        .select_related("instance__machine", "instance__rental")
        .prefetch_related(all_free_offers("instance__machine__offers"))
        .order_by("deployment_id", "created_at", "pk")
    )


def _roll_in_place(deployment: Deployment, current: str, reason: str) -> tuple[bool, str]:
    """A rolling replica set whose new replica found no room beside the old ones: one old
    replica stops, so the new one takes its place once its GPUs are free. Not while failures
    back off (a spec that keeps failing must not take the old replicas down with it)."""
    live = scaling.serving(deployment, _live(deployment))
    old = rolling.old_replicas(deployment, live, current)
    if not old or not reason:
        return False, reason
    backing_off = bool(failure_backoff(_failures_of(deployment), timezone.now()))
    victim, reason = roll_in_place(
        live, old, wanted_live(deployment), reason, backing_off=backing_off
    )
    if victim is None:
        return False, reason
    replica_end(victim, R.STOPPED, rolling.REPLACED_IN_PLACE)
    return True, reason


# --- placing --------------------------------------------------------------------------------


def _recent_failures():
    """Replicas that failed in the last RECENT_FAILURES, newest first."""
    since = timezone.now() - RECENT_FAILURES
    return Replica.objects.filter(state=R.FAILED, ended_at__gte=since).order_by("-ended_at")


def _failures_of(deployment: Deployment) -> list[tuple[datetime, str]]:
    """The deployment's recent failures as ``failure_backoff`` reads them."""
    return list(_recent_failures().filter(deployment=deployment).values_list("ended_at", "reason"))


# --- waking ---------------------------------------------------------------------------------


def deployment_wake(deployment_id: int) -> None:
    """Queue a pass over the deployment once the current transaction commits."""
    task_queue_on_commit("marketplace.tasks.deployment_reconcile", deployment_id)


def deployments_wake_waiting(deployment_ids: set[int]) -> None:
    """Queue one pass over all these deployments with queued replicas (capacity appeared),
    once the current transaction commits: one task and one snapshot of the fleet for them
    all, however many wait. One that another worker is reconciling is skipped: that pass, or
    the next sweep, sees the capacity."""
    task_queue_on_commit("marketplace.tasks.deployments_place_waiting", sorted(deployment_ids))


def deployments_waiting_for_capacity() -> list[int]:
    """Active deployments with queued replicas: capacity that appears may be theirs."""
    return list(
        Deployment.objects.filter(state=DeploymentState.ACTIVE, replicas__state=R.QUEUED)
        .values_list("pk", flat=True)
        .distinct()
    )


def deployments_on_machine(machine_id: int) -> list[int]:
    """Active deployments with live replicas on the machine (it went offline: replace them)."""
    return list(
        Deployment.objects.filter(
            state=DeploymentState.ACTIVE,
            replicas__state__in=LIVE_REPLICA_STATES,
            replicas__instance__machine_id=machine_id,
        )
        .values_list("pk", flat=True)
        .distinct()
    )
