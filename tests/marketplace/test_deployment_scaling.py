"""The scaling planner (marketplace/deployments/scaling.py) over replicas in memory: what a
pass decides while a host does not answer, when it answers again, and past the grace. The
whole outage on real hosts is tests/clusters/test_unreachable_replicas.py."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from marketplace.deployments.scaling import plan_scale, serving
from marketplace.models import Deployment, Replica
from marketplace.models.deployments import DeploymentMode
from scheduler.models import Instance

START = timezone.now()


def replica(n: int, instance_state: str | None = "running") -> Replica:
    """Replica ``n`` (made n seconds after the first), placed on an instance in that state,
    or queued (``None``)."""
    instance = Instance(state=instance_state) if instance_state else None
    return Replica(
        pk=n,
        state="running" if instance_state else "queued",
        instance=instance,
        created_at=START + timedelta(seconds=n),
    )


def replica_set(count: int = 2) -> Deployment:
    return Deployment(mode=DeploymentMode.REPLICASET, replica_count=count)


def decide(deployment: Deployment, live: list[Replica], wanted: int = 2):
    plan = plan_scale(serving(deployment, live), wanted)
    return [(r.pk, reason) for r, reason in plan.stop], plan.queue


def test_a_replica_whose_host_does_not_answer_is_kept_and_surged_past():
    live = [replica(1, "unknown"), replica(2)]
    assert decide(replica_set(), live) == ([], 1)


def test_a_surge_replica_placed_meanwhile_is_not_doubled():
    live = [replica(1, "unknown"), replica(2), replica(3)]
    assert decide(replica_set(), live) == ([], 0)


def test_when_the_host_answers_the_surplus_is_scaled_down_newest_first():
    live = [replica(1), replica(2), replica(3), replica(4, None)]
    assert decide(replica_set(), live) == ([(4, "Scaled down"), (3, "Scaled down")], 0)


def test_past_the_grace_the_lost_replica_is_gone_and_the_surge_replica_stays():
    # The pass ended it (lost) before planning: it is not live any more.
    live = [replica(2), replica(3)]
    assert decide(replica_set(), live) == ([], 0)


def test_a_job_does_not_surge_its_unreachable_replicas_count():
    job = Deployment(mode=DeploymentMode.JOB, replica_count=2, completions=2)
    live = [replica(1, "unknown"), replica(2)]
    assert decide(job, live) == ([], 0)


def test_scaled_down_during_an_outage_stops_only_replicas_that_answer():
    live = [replica(1, "unknown"), replica(2, "unknown"), replica(3), replica(4)]
    assert decide(replica_set(1), live, wanted=1) == ([(4, "Scaled down")], 0)
