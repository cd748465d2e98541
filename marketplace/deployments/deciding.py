"""What a pass over a deployment decides, apart from what it writes: ``decide`` takes what the
pass observed (the deployment, its live replicas and their instances, its recent failures, the
time) and returns what to change, reading and writing nothing. The reconciler observes,
decides, then applies (``reconciler._apply``), as ``rolling.plan_roll`` and
``scaling.plan_scale`` plan and the reconciler applies.

The rules, in the order a pass takes them:

- each placed replica follows its instance (``replica_state_for``): placed, running, or ended
  (succeeded, failed, stopped, lost);
- a job is completed at its completions and failed past its backoff limit;
- a deployment that is not active ends every live replica;
- replicas that no longer meet changed conditions end, and a job's that run an old spec;
- the replicas that count (``scaling.serving``) are brought to what is wanted, or, while some
  run an old spec, rolled a step (``rolling.plan_roll``);
- queued replicas are placed, unless recent failures back off (``failure_backoff``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from hosts.models import MachineStatus
from marketplace.deployments import rolling, scaling
from marketplace.deployments.conditions import instance_meets_conditions, replica_runs_spec
from marketplace.models import Deployment, Replica
from marketplace.models.deployments import (
    LIVE_REPLICA_STATES,
    DeploymentMode,
    DeploymentState,
    ReplicaState,
)
from scheduler.models import Instance, InstanceState

R = ReplicaState
ENDED_REPLICA_STATES = (R.SUCCEEDED, R.FAILED, R.STOPPED, R.LOST)

# Replacing replicas that keep failing waits longer each time (10 s, 20 s, … 5 min), counting
# the failures of the last RECENT_FAILURES: a bad image must not rent and release machines in
# a tight loop. The first failure is replaced at once.
RECENT_FAILURES = timedelta(minutes=10)
BACKOFF_START = timedelta(seconds=10)
BACKOFF_MAX = timedelta(minutes=5)


@dataclass(frozen=True)
class Observed:
    """What a pass over one deployment read before changing anything."""

    deployment: Deployment
    live: list[Replica]  # its live replicas, oldest first, with their instances and machines
    now: datetime
    grace: timedelta  # how long a replica whose host does not answer is kept
    spec: str  # the current spec's hash (``conditions.spec_hash``)
    counts: dict[str, int] = field(default_factory=dict)  # a job's replicas by state, all
    failures: list[tuple[datetime, str]] = field(default_factory=list)  # recent, newest first
    readiness: str = ""  # ``rolling.readiness``, read when replicas run an old spec
    meets_conditions: Callable[[Deployment, Instance], bool] = instance_meets_conditions


@dataclass(frozen=True)
class Change:
    """A replica's new state; for an ended one, why, and its container's exit code."""

    replica: Replica
    state: str
    reason: str = ""
    exit_code: int | None = None


@dataclass
class Decision:
    """What to change. The replicas here are copies of the observed ones (``decide`` leaves
    those as they were), in the states the changes give them."""

    follows: list[Change] = field(default_factory=list)  # replicas following their instances
    settled: str = ""  # a job's final deployment state, or ""
    ends: list[Change] = field(default_factory=list)  # live replicas stopped after that
    queue: int = 0  # new replicas to queue
    rolling: bool = False  # replicas run an old spec
    readiness: str = ""  # while rolling: what a new replica must do besides running
    reason: str = ""  # why queued replicas wait (failures back off), or ""
    place: bool = False  # queued replicas are to be placed now
    live: list[Replica] = field(default_factory=list)  # still live afterwards, new ones aside

    @property
    def changed(self) -> bool:
        return bool(self.follows or self.settled or self.ends or self.queue)


def decide(observed: Observed) -> Decision:
    """What a pass changes, given what it observed (the rules in this module's docstring)."""
    deployment = observed.deployment
    decision = Decision()
    counts = dict(observed.counts)
    replicas = [copy.copy(replica) for replica in observed.live]
    for replica in replicas:
        change = _follow(replica, observed.now, observed.grace)
        if change is not None:
            counts[replica.state] = counts.get(replica.state, 0) - 1
            counts[change.state] = counts.get(change.state, 0) + 1
            replica.state = change.state
            decision.follows.append(change)
    state = deployment.state
    if deployment.is_job and state == DeploymentState.ACTIVE:
        if counts.get(R.SUCCEEDED, 0) >= deployment.completions:
            decision.settled = state = DeploymentState.COMPLETED
        elif counts.get(R.FAILED, 0) > deployment.backoff_limit:
            decision.settled = state = DeploymentState.FAILED
    live = [r for r in replicas if r.state in LIVE_REPLICA_STATES]
    if state != DeploymentState.ACTIVE:
        reason = f"The deployment is {state}"
        decision.ends = [Change(r, R.STOPPED, reason) for r in live]
        _end(decision.ends)
        return decision
    decision.ends = _mismatched(observed, live)
    _end(decision.ends)
    live = [r for r in live if r.state in LIVE_REPLICA_STATES]
    counted = scaling.serving(deployment, live)
    wanted = wanted_of(deployment, counts.get(R.SUCCEEDED, 0))
    old = rolling.old_replicas(deployment, counted, observed.spec)
    if old:
        decision.rolling, decision.readiness = True, observed.readiness
        plan = rolling.plan_roll(counted, old, wanted, gated=bool(observed.readiness))
    else:
        plan = scaling.plan_scale(counted, wanted)
    stops = [Change(replica, R.STOPPED, reason) for replica, reason in plan.stop]
    _end(stops)
    decision.ends += stops
    decision.queue = plan.queue
    decision.live = [r for r in live if r.state in LIVE_REPLICA_STATES]
    queued = plan.queue + sum(r.state == R.QUEUED for r in decision.live)
    if queued:
        # Replicas that failed just now count as failed at ``now``, the newest.
        failed = [(observed.now, c.reason[:300]) for c in decision.follows if c.state == R.FAILED]
        decision.reason = failure_backoff(failed[::-1] + observed.failures, observed.now)
        decision.place = not decision.reason
    return decision


def _follow(replica: Replica, now: datetime, grace: timedelta) -> Change | None:
    if replica.instance is None:
        return None
    state, reason, exit_code = replica_state_for(replica, now=now, grace=grace)
    if state == replica.state:
        return None
    return Change(replica, state, reason, exit_code)


def _end(changes: list[Change]) -> None:
    for change in changes:
        change.replica.state = change.state


def _mismatched(observed: Observed, live: list[Replica]) -> list[Change]:
    """Replicas placed before the conditions changed, that no longer meet them, end (and a
    job's replicas placed before its spec changed); ``scaling.plan_scale`` queues their
    replacements. A replica set's replicas of an old spec are rolled instead (``rolling``)."""
    deployment = observed.deployment
    ends = []
    for replica in live:
        if replica.instance is None:
            continue
        if not observed.meets_conditions(deployment, replica.instance):
            reason = "Replaced: it no longer meets the deployment's conditions"
            ends.append(Change(replica, R.STOPPED, reason))
        elif deployment.is_job and not replica_runs_spec(deployment, replica, observed.spec):
            ends.append(Change(replica, R.STOPPED, "Replaced: the spec changed"))
    return ends


def replica_state_for(
    replica: Replica, *, now: datetime, grace: timedelta
) -> tuple[str, str, int | None]:
    """What the replica's instance (and its machine) say the replica is: state, reason, exit
    code. ``grace``: how long a replica whose host does not answer is kept."""
    instance: Instance = replica.instance
    state = instance.state
    machine_status = instance.machine.status
    message = instance.status_message
    # A paused replica is still the renter's, on its GPUs: it counts as running. A machine
    # that stopped answering is no proof its containers died: they are unknown (below) first.
    if state == InstanceState.LAUNCHING and machine_status != MachineStatus.ONLINE:
        # Not started yet, on a machine that cannot start it: placed again elsewhere now (its
        # destroy waits for the host to confirm, so its GPUs are never shared meanwhile).
        return R.LOST, f"Its machine is {machine_status}", None
    if state in (InstanceState.LAUNCHING, InstanceState.RUNNING, InstanceState.PAUSED):
        return (R.PLACED if state == InstanceState.LAUNCHING else R.RUNNING), "", None
    if state == InstanceState.UNKNOWN:
        if now - instance.state_changed_at < grace:
            return replica.state, message, None  # kept, and adopted again if its host answers
        return R.LOST, f"Its machine has been {machine_status} for too long: {message}", None
    if state == InstanceState.EXITED:
        code = instance.exit_code
        if code == 0:
            return R.SUCCEEDED, "Exited with code 0", 0
        return R.FAILED, (f"Exited with code {code}" if code is not None else message), code
    if state == InstanceState.FAILED:
        # A launch that failed is the spec's doing (it counts against a job's backoff); a
        # container that vanished after it ran is not.
        return (R.LOST if replica.started_at else R.FAILED), message, None
    if state in (InstanceState.STOPPING, InstanceState.STOPPED):
        return R.STOPPED, message or "Its rental was stopped", None
    return R.LOST, message or f"Its rental is {state}", None  # expired, destroying, destroyed


def wanted_of(deployment: Deployment, succeeded: int) -> int:
    """How many replicas should be live (queued, placed or running), given how many of a
    job's have succeeded."""
    if deployment.state != DeploymentState.ACTIVE:
        return 0
    if deployment.mode == DeploymentMode.REPLICASET:
        return deployment.replica_count
    remaining = deployment.completions - succeeded
    return max(min(deployment.replica_count, remaining), 0)


def failure_backoff(failures: list[tuple[datetime, str]], now: datetime) -> str:
    """Why replacements must wait now, given the deployment's recent failures (ended at,
    reason; newest first), or ""."""
    count = len(failures)
    if count < 2:
        return ""
    last_ended, last_reason = failures[0]
    wait = min(BACKOFF_START * 2 ** (count - 2), BACKOFF_MAX)
    next_try = last_ended + wait
    if now >= next_try:
        return ""
    seconds = int((next_try - now).total_seconds()) + 1
    return (
        f"{count} replicas failed in the last 10 minutes (last: {last_reason or 'no reason'}); "
        f"trying again in {seconds} s"
    )


def roll_in_place(
    live: list[Replica], old: list[Replica], wanted: int, reason: str, *, backing_off: bool
) -> tuple[Replica | None, str]:
    """A rolling replica set whose new replica found no room beside the old ones (``reason``
    says why): the old replica to stop so the new one takes its place once its GPUs are
    free, and the deployment's queue reason. None while failures back off (a spec that keeps
    failing must not take the old replicas down with it)."""
    if not old or not reason:
        return None, reason
    if backing_off:
        return None, f"rolling update waits: {reason}"
    victim = rolling.in_place_victim(live, old, wanted)
    if victim is None:
        return None, f"rolling update waits: {reason}"
    return victim, (
        f"rolling update, replacing in place (replica {victim.pk} stopped): no room for a "
        f"replica of the new spec beside the old ones: {reason}"
    )
