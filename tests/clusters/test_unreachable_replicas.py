"""A cluster whose replica's host stops answering SSH (its sshd really stopped; Docker, and so
the container, keeps running): nothing is destroyed within the grace, the gateway keeps
routing to the replica that still answers, a surge replica is placed where there is room,
and when the host answers again the replica is adopted back and the surge one scaled down.
Traffic flows through the real gateway the whole time."""

from __future__ import annotations

import pytest

from hosts.models import Machine
from hosts.services import machine_heartbeat
from marketplace.models import Cluster, Rental, Replica
from scheduler.gateway import replica_upstreams
from tests.billing.ledger_checks import assert_ledger_consistent
from tests.clusters.support import CLUSTER, Load, routed, routes_settle
from tests.clusters.test_cluster_gateway import bearer, key_secret, path_of
from tests.conftest import key_client
from tests.marketplace.conftest import docker, machine_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="session")
def one_gpu_hosts(sim_host_factory):
    """Three 1-GPU simulated hosts: a 2-replica cluster leaves room for one surge replica."""
    return [sim_host_factory(gpus=1) for _ in range(3)]


def host_stops_answering(host, machine: Machine) -> Machine:
    """Stop the host's sshd (its containers run on) and let heartbeats miss until the
    machine is offline, as the beat's heartbeats would."""
    host.stop()
    for _ in range(5):
        machine = machine_heartbeat(machine_id=machine.pk)
        if machine.status == "offline":
            return machine
    raise AssertionError(f"machine {machine.pk} is {machine.status} after 5 missed heartbeats")


def replicas(cluster_id: int) -> list[Replica]:
    deployment = Cluster.objects.get(pk=cluster_id).deployment
    return list(deployment.replicas.select_related("instance").order_by("created_at", "pk"))


def upstream_of(replica: Replica) -> str:
    return replica_upstreams([replica.instance_id], CLUSTER["service_port"])[replica.instance_id]


def test_a_replica_whose_host_stops_answering_is_kept_routed_surged_past_and_adopted_back(
    funded_team, provider_team, one_gpu_hosts, gateway
):
    machines = [machine_for(host, provider_team) for host in one_gpu_hosts]
    client = key_client(funded_team)
    response = client.post("/api/v1/clusters/", {**CLUSTER, "replicas": 2}, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    cluster_id = created["id"]
    routes_settle(gateway.admin, cluster_id, 2)
    kept, other = replicas(cluster_id)
    by_machine = dict(zip([m.pk for m in machines], one_gpu_hosts, strict=True))
    host, machine = by_machine[kept.instance.machine_id], kept.instance.machine
    docker("exec", kept.instance.container_id, "sh", "-c", "echo mine > /www/data.txt")
    charged_since = Rental.objects.get(instance=kept.instance).gpu_clock_since
    assert charged_since is not None

    with Load(gateway.listen, path_of(created["url"]), bearer(key_secret(funded_team)), 20) as load:
        load.more(20)
        try:
            machine = host_stops_answering(host, machine)
            kept.instance.refresh_from_db()
            assert kept.instance.state == "unknown"
            # Within the grace: kept (still running, routed), a surge replica placed elsewhere.
            listed = client.get(f"/api/v1/clusters/{cluster_id}/replicas/").json()
            shown = {r["id"]: r for r in listed}
            assert shown[kept.pk]["state"] == "running"
            assert shown[kept.pk]["unreachable_since"] is not None
            assert shown[other.pk]["unreachable_since"] is None
            [surge] = [
                r for r in replicas(cluster_id) if r.is_live and r.pk not in (kept.pk, other.pk)
            ]
            assert surge.state == "running", surge.reason
            assert surge.instance.machine_id not in (
                kept.instance.machine_id,
                other.instance.machine_id,
            )
            now_routed = routes_settle(gateway.admin, cluster_id, 3)
            assert upstream_of(kept) in now_routed  # the gateway's health checks decide
            # Not charged while its host cannot say it runs; the others are.
            assert Rental.objects.get(instance=kept.instance).gpu_clock_since is None
            assert Rental.objects.get(instance=other.instance).gpu_clock_since is not None
            assert Rental.objects.get(instance=surge.instance).gpu_clock_since is not None
            load.more(40)
        finally:
            host.start()

        # The host answers within the grace: adopted back, the surge replica scaled down.
        assert machine_heartbeat(machine_id=machine.pk).status == "online"
        kept.refresh_from_db()
        kept.instance.refresh_from_db()
        surge.refresh_from_db()
        surge.instance.refresh_from_db()
        assert (kept.state, kept.instance.state) == ("running", "running")
        assert (surge.state, surge.reason) == ("stopped", "Scaled down")
        assert surge.instance.state == "destroyed"
        assert routes_settle(gateway.admin, cluster_id, 2) == {
            upstream_of(kept),
            upstream_of(other),
        }
        load.more(40)

    assert load.failed == [], load.failed[:5]
    # Its container ran through the outage, with its data.
    shown = docker("exec", kept.instance.container_id, "cat", "/www/data.txt").stdout
    assert shown.strip() == "mine"
    assert Rental.objects.get(instance=kept.instance).gpu_clock_since is not None
    assert Rental.objects.get(instance=surge.instance).settled_at is not None
    assert [r.pk for r in replicas(cluster_id) if r.is_live] == [kept.pk, other.pk]
    assert len(routed(gateway.admin, cluster_id)) == 2
    assert_ledger_consistent()
