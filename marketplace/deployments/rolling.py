"""Rolling updates of a replica set: a change to the container spec (image, env, args, …) is
rolled out with a surge of one and none unavailable.

Each replica records the spec it runs as it is placed (``Replica.spec_hash``; a queued
replica runs nothing yet, so it is always of the current spec). While any placed replica runs
an old spec, a pass:

- stops old replicas only as replicas of the new spec are RUNNING (behind a cluster's URL: and
  answering there, `readiness_gates`): as many old ones stay as
  the running new ones leave wanted (old ones that are not running yet go first); while a new
  replica runs but does not answer yet, the deployment's queue reason says so
  (``readiness_wait``);
- queues replacements for any replica that was lost, so the set never shrinks below wanted;
- queues at most one extra (surge) replica of the new spec, and only while no other new
  replica is on its way (queued or launching);
- where that extra replica finds no room (no capacity, the budget), stops one old replica
  (a launching one first, else the oldest) so the new one takes its place: replace-in-place,
  said in the deployment's queue reason and the old replica's reason.

A pure planner over the pass's replicas: the reconciler applies what it returns, under the
deployment's row lock like everything else in a pass. Jobs are not rolled: a replica of a job
that no longer runs the spec is replaced at once (``deciding._mismatched``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from marketplace.deployments.conditions import replica_runs_spec
from marketplace.models import Deployment, Replica
from marketplace.models.deployments import DeploymentMode, ReplicaState

R = ReplicaState

REPLACED = "Replaced by a running replica of the new spec"
REPLACED_IN_PLACE = "Replaced in place: no room for a replica of the new spec beside it"
SCALED_DOWN = "Scaled down"


# What a new replica of a deployment must do, besides running, before it takes an old one's
# place, in words ("answer on port 8080 at the cluster's URL"), or "" when running is enough.
# The clusters package gates a cluster with a URL; the rest roll on running.
readiness_gates: list[Callable[[Deployment], str]] = []


def readiness(deployment: Deployment) -> str:
    return next((gate for check in readiness_gates if (gate := check(deployment))), "")


@dataclass
class RollPlan:
    stop: list[tuple[Replica, str]] = field(default_factory=list)
    queue: int = 0


def old_replicas(deployment: Deployment, live: list[Replica], current: str) -> list[Replica]:
    """The placed replicas of a replica set that run another spec than the current one."""
    if deployment.mode != DeploymentMode.REPLICASET:
        return []
    return [
        r for r in live if r.instance is not None and not replica_runs_spec(deployment, r, current)
    ]


def _launching_first_then_oldest(replicas: list[Replica]) -> list[Replica]:
    return sorted(replicas, key=lambda r: (r.state == R.RUNNING, r.created_at, r.pk))


def queued_first_then_newest(replicas: list[Replica], *, gated: bool = False) -> list[Replica]:
    """The order extras stop in: queued ones, then those still on their way (not ready), then
    the newest. A ready replica never stops while one on its way is kept: stopping the newest
    running one and keeping a launching one took serving replicas below what was wanted."""
    return sorted(
        replicas,
        key=lambda r: (r.state == R.QUEUED, not _ready(r, gated), r.created_at, r.pk),
        reverse=True,
    )


def _ready(replica: Replica, gated: bool) -> bool:
    """Whether a new replica may take an old one's place: running, and where the deployment
    is gated (a cluster's URL), answering there too."""
    return replica.state == R.RUNNING and (not gated or replica.ready_at is not None)


def plan_roll(
    live: list[Replica], old: list[Replica], wanted: int, *, gated: bool = False
) -> RollPlan:
    """What to stop and how many to queue while ``old`` (a non-empty part of ``live``) run an
    old spec. ``gated``: a new replica counts only once it is ready (``_ready``)."""
    plan = RollPlan()
    new = [r for r in live if r not in old]
    new_running = sum(_ready(r, gated) for r in new)
    # Retire: as many old replicas stay as the running new ones leave wanted.
    keep_old = max(wanted - new_running, 0)
    ordered_old = _launching_first_then_oldest(old)
    for replica in ordered_old[: max(len(old) - keep_old, 0)]:
        plan.stop.append((replica, REPLACED if new_running else SCALED_DOWN))
    old_left = ordered_old[max(len(old) - keep_old, 0) :]
    # Scaled down meanwhile: new ones past what is wanted stop, queued and on their way first.
    ordered_new = queued_first_then_newest(new, gated=gated)
    for replica in ordered_new[: max(len(new) - wanted, 0)]:
        plan.stop.append((replica, SCALED_DOWN))
    new_left = ordered_new[max(len(new) - wanted, 0) :]
    # Never more than one over what is wanted: the new ones on their way go first, then old.
    over = len(new_left) + len(old_left) - (wanted + 1)
    if over > 0:
        pending = [r for r in new_left if not _ready(r, gated)]
        surplus = (pending + _launching_first_then_oldest(old_left))[:over]
        plan.stop.extend((r, SCALED_DOWN) for r in surplus)
        new_left = [r for r in new_left if r not in surplus]
        old_left = [r for r in old_left if r not in surplus]
    total = len(new_left) + len(old_left)
    # Replace what was lost, then surge by one while no new replica is on its way.
    plan.queue = max(wanted - total, 0)
    on_the_way = any(not _ready(r, gated) for r in new_left)
    if old_left and not plan.queue and not on_the_way and total <= wanted:
        plan.queue = 1
    return plan


def readiness_wait(live: list[Replica], old: list[Replica], readiness: str) -> str:
    """Why a gated roll waits, when it waits on a new replica that runs but is not ready (a
    wrong port, an app still starting): the deployment's queue reason. "" otherwise."""
    unready = [r for r in live if r not in old and r.state == R.RUNNING and r.ready_at is None]
    if not readiness or not unready:
        return ""
    names = ", ".join(str(r.pk) for r in unready)
    return (
        f"rolling update waits for replica{'s' if len(unready) > 1 else ''} {names} to "
        f"{readiness}; the old replicas keep serving meanwhile"
    )


def in_place_victim(live: list[Replica], old: list[Replica], wanted: int) -> Replica | None:
    """The old replica to stop when a new one is queued and found no room beside it, or None
    (nothing queued, or the queued one replaces a lost replica rather than surging)."""
    if not old or len(live) <= wanted or not any(r.state == R.QUEUED for r in live):
        return None
    return _launching_first_then_oldest(old)[0]
