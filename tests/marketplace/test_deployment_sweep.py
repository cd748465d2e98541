"""The beat sweep passes over unsettled deployments only, and settles what an event missed.

An event that never arrived is played by changing the row the way the lost event's own change
would have (``QuerySet.update`` sends no signal), on a simulated host (real sshd + Docker).
"""

from __future__ import annotations

import pytest

from marketplace.deployments.sweep import deployments_sweep, deployments_unsettled
from marketplace.models import Deployment, Replica
from scheduler.models import Instance
from tests.conftest import key_client
from tests.marketplace.conftest import machine_for

QUICK_STOP = ["-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
SPEC = {
    "name": "sweep", "image": "gpumkt/busybox:latest", "entrypoint": "sh", "args": QUICK_STOP,
    "gpus_per_replica": 1, "duration_hours": 1,
}  # fmt: skip


@pytest.fixture(scope="session")
def two_gpu_host(sim_host_factory):
    return sim_host_factory(gpus=2)


def running_replicas(deployment_id: int) -> list[Replica]:
    return list(Replica.objects.filter(deployment_id=deployment_id, state="running"))


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_the_sweep_leaves_settled_deployments_and_settles_missed_events(
    funded_team, provider_team, two_gpu_host
):
    machine_for(two_gpu_host, provider_team)
    client = key_client(funded_team)
    created = client.post("/api/v1/deployments/", {**SPEC, "replicas": 1}, format="json")
    assert created.status_code == 201, created.content
    deployment_id = created.json()["id"]
    [first] = running_replicas(deployment_id)

    # Settled: the sweep has nothing to look at and changes nothing.
    assert deployment_id not in deployments_unsettled()
    assert deployments_sweep() == 0

    # The scale-up's event is lost: the sweep sees too few replicas and places one.
    Deployment.objects.filter(pk=deployment_id).update(replica_count=2)
    assert deployment_id in deployments_unsettled()
    assert deployments_sweep() == 1
    assert len(running_replicas(deployment_id)) == 2
    assert deployment_id not in deployments_unsettled()

    # The instance's exit event is lost: the sweep sees the replica out of step with it, ends
    # it (its rental destroyed) and places a replacement.
    Instance.objects.filter(pk=first.instance_id).update(state="exited", exit_code=3)
    assert deployment_id in deployments_unsettled()
    deployments_sweep()
    first.refresh_from_db()
    assert (first.state, first.exit_code) == ("failed", 3)
    assert Instance.objects.get(pk=first.instance_id).state in ("destroying", "destroyed")
    assert len(running_replicas(deployment_id)) == 2
    assert deployment_id not in deployments_unsettled()


@pytest.mark.django_db
def test_a_stopped_deployment_with_live_replicas_is_unsettled(funded_team):
    deployment = Deployment.objects.create(
        team=funded_team, name="left", image="gpumkt/busybox:latest", state="stopped"
    )
    Replica.objects.create(deployment=deployment)  # queued, though the deployment stopped
    assert deployment.pk in deployments_unsettled()
    assert deployments_sweep() == 1
    assert Replica.objects.get(deployment=deployment).state == "stopped"
    assert deployment.pk not in deployments_unsettled()
