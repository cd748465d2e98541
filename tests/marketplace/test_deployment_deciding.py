"""What a pass over a deployment decides (marketplace/deployments/deciding.py), over
replicas in memory: no database, no hosts. Properties over generated replica sets and jobs
(their replicas' states, their instances' and machines' states, old and new specs, failures),
then the rules one example each. The reconciler applying the decisions on real hosts is
tests/marketplace/test_deployments.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from hosts.models import Machine, MachineStatus
from marketplace.deployments import scaling
from marketplace.deployments.deciding import (
    ENDED_REPLICA_STATES,
    Decision,
    Observed,
    decide,
)
from marketplace.models import Deployment, Replica
from marketplace.models.deployments import (
    LIVE_REPLICA_STATES,
    DeploymentMode,
    DeploymentState,
    ReplicaState,
)
from scheduler.models import Instance
from tests.conftest import examples

R = ReplicaState
NOW = timezone.now()
GRACE = timedelta(minutes=10)
CURRENT, OLD = "current-spec", "old-spec"
GATE = "answer on port 8080 at the cluster's URL"

# An instance's state, and what its machine says, as a placed replica may find them.
INSTANCE_STATES = [
    "launching", "running", "paused", "unknown", "exited", "failed", "stopping", "stopped",
    "expired", "destroying", "destroyed",
]  # fmt: skip


@dataclass(frozen=True)
class Seen:
    """One live replica as generated: queued (no instance), or placed on an instance."""

    placed: bool
    replica_state: str  # placed or running, for a placed one
    instance_state: str
    machine_online: bool
    exit_code: int | None
    minutes_unknown: int
    old_spec: bool
    ready: bool
    started: bool


seen = st.builds(
    Seen,
    placed=st.sampled_from([True] * 4 + [False]),
    replica_state=st.sampled_from([R.PLACED, R.RUNNING]),
    # Mostly healthy, as a roll mostly finds them; every other state now and then.
    instance_state=st.sampled_from(["running"] * 6 + ["launching"] * 2 + INSTANCE_STATES),
    machine_online=st.booleans(),
    exit_code=st.sampled_from([None, 0, 1, 137]),
    minutes_unknown=st.integers(0, 20),
    old_spec=st.booleans(),
    ready=st.booleans(),
    started=st.booleans(),
)


def replica(n: int, s: Seen) -> Replica:
    created = NOW - timedelta(hours=1) + timedelta(seconds=n)
    if not s.placed:
        return Replica(pk=n, state=R.QUEUED, created_at=created)
    machine = Machine(
        pk=n, status=MachineStatus.ONLINE if s.machine_online else MachineStatus.OFFLINE
    )
    instance = Instance(
        pk=n,
        machine=machine,
        state=s.instance_state,
        exit_code=s.exit_code,
        status_message="what the host said",
        state_changed_at=NOW - timedelta(minutes=s.minutes_unknown),
    )
    return Replica(
        pk=n,
        state=s.replica_state,
        instance=instance,
        created_at=created,
        spec_hash=OLD if s.old_spec else CURRENT,
        ready_at=NOW if s.ready else None,
        started_at=created if s.started else None,
    )


def observed(deployment: Deployment, replicas: list[Replica], **fields) -> Observed:
    return Observed(
        deployment=deployment,
        live=replicas,
        now=NOW,
        grace=GRACE,
        spec=CURRENT,
        meets_conditions=lambda deployment, instance: True,
        **fields,
    )


def states_after_follows(decision: Decision, replicas: list[Replica]) -> dict[int, str]:
    states = {r.pk: r.state for r in replicas}
    states.update({c.replica.pk: c.state for c in decision.follows})
    return states


deployments = st.builds(
    Deployment,
    mode=st.sampled_from([DeploymentMode.REPLICASET, DeploymentMode.JOB]),
    state=st.sampled_from([DeploymentState.ACTIVE] * 4 + [DeploymentState.STOPPED]),
    replica_count=st.integers(0, 5),
    completions=st.integers(1, 6),
    backoff_limit=st.integers(0, 3),
)
failures = st.lists(
    st.integers(0, 600).map(lambda s: (NOW - timedelta(seconds=s), "Exited with code 1")),
    max_size=4,
).map(lambda rows: sorted(rows, reverse=True))


@settings(max_examples=examples(300), deadline=None)
@given(
    deployment=deployments,
    seen_list=st.lists(seen, max_size=8),
    succeeded=st.integers(0, 6),
    failed=st.integers(0, 4),
    failed_recently=failures,
    gated=st.booleans(),
)
def test_a_pass_never_asks_for_more_than_wanted_nor_leaves_a_set_short(
    deployment, seen_list, succeeded, failed, failed_recently, gated
):
    replicas = [replica(n, s) for n, s in enumerate(seen_list, start=1)]
    before = [(r.pk, r.state, r.started_at) for r in replicas]
    counts = {R.SUCCEEDED: succeeded, R.FAILED: failed}
    for r in replicas:
        counts[r.state] = counts.get(r.state, 0) + 1
    seen_now = observed(
        deployment,
        replicas,
        counts=counts if deployment.is_job else {},
        failures=failed_recently,
        readiness=GATE if gated else "",
    )
    decision = decide(seen_now)

    # It decides on copies: what was observed is left as it was.
    assert [(r.pk, r.state, r.started_at) for r in replicas] == before
    # Every replica it changes was live; a follow changes a state, an end ends it.
    assert all(c.state != next(r.state for r in replicas if r.pk == c.replica.pk)
               for c in decision.follows)  # fmt: skip
    assert all(c.state in ENDED_REPLICA_STATES for c in decision.ends)
    ended = [c.replica.pk for c in decision.ends]
    assert len(ended) == len(set(ended))
    assert all(r.state in LIVE_REPLICA_STATES for r in decision.live)

    active = deployment.state == DeploymentState.ACTIVE and not decision.settled
    if not active:
        # Not active (or a job settled just now): every live replica ends, nothing is queued.
        assert decision.queue == 0 and not decision.place and decision.live == []
        states = states_after_follows(decision, replicas)
        still = {pk for pk, state in states.items() if state in LIVE_REPLICA_STATES}
        assert still == set(ended)
        return

    done = succeeded + sum(c.state == R.SUCCEEDED for c in decision.follows)
    if deployment.is_job:
        wanted = max(min(deployment.replica_count, deployment.completions - done), 0)
        # A job neither surges nor rolls: exactly what is wanted, unreachable ones included.
        assert len(decision.live) + decision.queue == wanted
        assert not decision.rolling
    else:
        wanted = deployment.replica_count
        serving = len(scaling.serving(deployment, decision.live))
        # Never more than asked, one surge replica aside while rolling; never short.
        assert wanted <= serving + decision.queue <= wanted + decision.rolling

    # Queued replicas are placed unless failures back off, which says so.
    queued = decision.queue + sum(r.state == R.QUEUED for r in decision.live)
    assert decision.place == (queued > 0 and not decision.reason)
    assert not decision.reason or queued > 0


@settings(max_examples=examples(300), deadline=None)
@given(
    replica_count=st.integers(1, 3),
    seen_list=st.lists(seen, min_size=1, max_size=5),
    gated=st.booleans(),
)
def test_a_roll_never_takes_serving_replicas_below_what_is_wanted(replica_count, seen_list, gated):
    """Old replicas stop only as new ones are running (and, behind a cluster's URL, answer
    there): the replicas serving after a pass are at least as many as before, up to what is
    wanted. The last serving replica of a roll is never stopped for a new one on its way."""
    deployment = Deployment(mode=DeploymentMode.REPLICASET, replica_count=replica_count)
    replicas = [replica(n, s) for n, s in enumerate(seen_list, start=1)]
    decision = decide(observed(deployment, replicas, readiness=GATE if gated else ""))
    if not decision.rolling:
        return
    states = states_after_follows(decision, replicas)

    def serves(r: Replica, state: str) -> bool:
        old = r.spec_hash == OLD
        return (
            state == R.RUNNING
            and not scaling.unreachable(r)
            and (old or not gated or r.ready_at is not None)
        )

    serving_before = sum(serves(r, states[r.pk]) for r in replicas)
    stopped = {c.replica.pk for c in decision.ends}
    serving_after = sum(serves(r, states[r.pk]) for r in replicas if r.pk not in stopped)
    assert serving_after >= min(replica_count, serving_before)


# --- the rules, one example each ------------------------------------------------------------


def placed(n: int, instance_state: str = "running", **fields) -> Replica:
    fields = {
        "placed": True, "replica_state": R.RUNNING, "instance_state": instance_state,
        "machine_online": True, "exit_code": None, "minutes_unknown": 0, "old_spec": False,
        "ready": True, "started": True, **fields,
    }  # fmt: skip
    return replica(n, Seen(**fields))


def replica_set(count: int = 2) -> Deployment:
    return Deployment(mode=DeploymentMode.REPLICASET, replica_count=count)


def test_a_replica_that_failed_just_now_counts_towards_the_backoff():
    failed = placed(1, "exited", exit_code=1)
    earlier = [(NOW - timedelta(seconds=5), "Exited with code 1")]
    decision = decide(observed(replica_set(1), [failed], failures=earlier))
    assert [(c.replica.pk, c.state, c.exit_code) for c in decision.follows] == [(1, R.FAILED, 1)]
    assert decision.queue == 1 and not decision.place
    assert decision.reason.startswith("2 replicas failed in the last 10 minutes")
    # Alone, a first failure is replaced at once.
    decision = decide(observed(replica_set(1), [placed(1, "exited", exit_code=1)]))
    assert decision.queue == 1 and decision.place and decision.reason == ""


def test_a_replica_whose_host_does_not_answer_is_kept_for_the_grace_then_lost():
    within = placed(1, "unknown", minutes_unknown=9)
    past = placed(2, "unknown", minutes_unknown=11)
    decision = decide(observed(replica_set(2), [within, past]))
    assert [(c.replica.pk, c.state) for c in decision.follows] == [(2, R.LOST)]
    # The kept one is neither counted nor stopped: two are queued for a set of two.
    assert decision.ends == [] and decision.queue == 2


def test_a_job_completes_at_its_completions_and_stops_what_still_runs():
    job = Deployment(mode=DeploymentMode.JOB, replica_count=2, completions=2)
    done, running = placed(1, "exited", exit_code=0), placed(2)
    counts = {R.SUCCEEDED: 1, R.RUNNING: 2}
    decision = decide(observed(job, [done, running], counts=counts))
    assert decision.settled == DeploymentState.COMPLETED
    assert [(c.replica.pk, c.state) for c in decision.ends] == [(2, R.STOPPED)]
    assert decision.queue == 0 and not decision.place


def test_a_replica_that_no_longer_meets_the_conditions_is_replaced():
    fine, moved = placed(1), placed(2)
    decision = decide(
        Observed(
            deployment=replica_set(2),
            live=[fine, moved],
            now=NOW,
            grace=GRACE,
            spec=CURRENT,
            meets_conditions=lambda deployment, instance: instance.pk != 2,
        )
    )
    assert [(c.replica.pk, c.reason) for c in decision.ends] == [
        (2, "Replaced: it no longer meets the deployment's conditions")
    ]
    assert decision.queue == 1 and decision.place


def test_a_roll_surges_one_and_stops_an_old_replica_only_once_a_new_one_answers():
    old = [placed(1, old_spec=True), placed(2, old_spec=True)]
    decision = decide(observed(replica_set(2), old, readiness=GATE))
    assert decision.rolling and decision.ends == [] and decision.queue == 1
    running_unready = placed(3, ready=False)
    decision = decide(observed(replica_set(2), [*old, running_unready], readiness=GATE))
    assert decision.ends == [] and decision.queue == 0
    ready = placed(3, ready=True)
    decision = decide(observed(replica_set(2), [*old, ready], readiness=GATE))
    assert [c.replica.pk for c in decision.ends] == [1] and decision.queue == 1
