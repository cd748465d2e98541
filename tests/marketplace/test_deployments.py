"""Elastic deployments on simulated hosts (real sshd + Docker): replicas placed by conditions,
replaced when they die, scaled, run to completions, queued with a reason until capacity
appears; and the API's shape, tenancy and refusals."""

from __future__ import annotations

import subprocess

import pytest
from django.db import transaction
from django.db.models.signals import post_save

from billing.models import Hold
from hosts import services as host_services
from hosts.models import Machine
from hosts.services.events import set_status
from marketplace.deployments import rolling
from marketplace.deployments.conditions import spec_hash
from marketplace.deployments.tasks import deployments_sweep
from marketplace.models import Deployment, Replica
from scheduler import services as scheduler
from scheduler.models import Instance, InstanceEvent
from scheduler.tasks import machines_reconcile
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund, machine_for

# Exits at once on `docker stop` (a bare `sleep` as PID 1 ignores SIGTERM for 10 s).
QUICK_STOP = ["-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
SPEC = {
    "name": "web", "image": "gpumkt/busybox:latest", "entrypoint": "sh", "args": QUICK_STOP,
    "gpu_names": ["RTX 4090"], "gpus_per_replica": 1, "duration_hours": 1,
}  # fmt: skip


@pytest.fixture(scope="session")
def three_hosts(sim_host_factory):
    """Three 2-GPU simulated hosts, shared by the tests here (each lists its own machines)."""
    return [sim_host_factory(gpus=2) for _ in range(3)]


def deploy(client, **overrides) -> dict:
    response = client.post("/api/v1/deployments/", {**SPEC, **overrides}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def replicas_of(client, deployment_id: int) -> list[dict]:
    response = client.get(f"/api/v1/deployments/{deployment_id}/replicas/")
    assert response.status_code == 200, response.content
    body = response.json()
    return body["results"] if isinstance(body, dict) else body


def live(replicas: list[dict]) -> list[dict]:
    return [r for r in replicas if r["state"] in ("queued", "placed", "running")]


def reconcile_until(client, deployment_id: int, done, tries: int = 12) -> dict:
    """Let the monitor look at the hosts (as its beat would) until ``done(deployment)``."""
    for _ in range(tries):
        deployment = client.get(f"/api/v1/deployments/{deployment_id}/").json()
        if done(deployment):
            return deployment
        machines_reconcile()
    raise AssertionError(f"never done: {deployment}")


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_replicaset_spreads_over_machines_and_replaces_a_killed_replica(
    funded_team, provider_team, three_hosts
):
    machines = [machine_for(host, provider_team) for host in three_hosts]
    client = key_client(funded_team)
    created = deploy(client, replicas=3, policy="spread")
    assert (created["state"], created["desired"], created["queued"]) == ("active", 3, 0)
    replicas = replicas_of(client, created["id"])
    assert [r["state"] for r in replicas] == ["running"] * 3
    # One replica per machine, though each machine has room for two.
    assert sorted(r["machine_id"] for r in replicas) == sorted(m.pk for m in machines)
    assert all(len(r["gpus"]) == 1 and r["container_name"] for r in replicas)

    victim = replicas[0]
    subprocess.run(["docker", "kill", victim["container_name"]], check=True, capture_output=True)
    scheduler.machine_reconcile(machine_id=victim["machine_id"])

    after = {r["id"]: r for r in replicas_of(client, created["id"])}
    assert after[victim["id"]]["state"] == "failed"
    assert after[victim["id"]]["exit_code"] == 137  # SIGKILL
    assert after[victim["id"]]["ended_at"] is not None
    running = [r for r in after.values() if r["state"] == "running"]
    assert len(running) == 3 and victim["id"] not in {r["id"] for r in running}
    # Its rental is gone (data goes with an elastic container), and so is its money hold.
    instance = Instance.objects.get(pk=Replica.objects.get(pk=victim["id"]).instance_id)
    assert instance.state == "destroyed"
    deployment = client.get(f"/api/v1/deployments/{created['id']}/").json()
    assert (deployment["running"], deployment["failed"], deployment["queued"]) == (3, 1, 0)


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_scaling_starts_and_stops_replicas_at_once(funded_team, provider_team, three_hosts):
    for host in three_hosts[:2]:
        machine_for(host, provider_team)
    client = key_client(funded_team)
    created = deploy(client, replicas=1, policy="binpack")
    url = f"/api/v1/deployments/{created['id']}/"

    grown = client.patch(url, {"replicas": 4}, format="json")
    assert grown.status_code == 200, grown.content
    assert (grown.json()["desired"], grown.json()["running"]) == (4, 4)
    # Binpack fills one machine before it cuts into the next.
    machines = [r["machine_id"] for r in live(replicas_of(client, created["id"]))]
    assert sorted(machines.count(m) for m in set(machines)) == [2, 2]

    shrunk = client.patch(url, {"replicas": 1}, format="json")
    assert (shrunk.json()["desired"], shrunk.json()["running"]) == (1, 1)
    replicas = replicas_of(client, created["id"])
    # The newest three stopped; the oldest runs on.
    assert [r["state"] for r in replicas] == ["running", "stopped", "stopped", "stopped"]
    stopped = Instance.objects.filter(replica__state="stopped")
    assert {i.state for i in stopped} == {"destroyed"}


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_job_runs_to_exactly_its_completions(funded_team, provider_team, three_hosts):
    for host in three_hosts[:2]:
        machine_for(host, provider_team)
    client = key_client(funded_team)
    created = deploy(client, mode="job", completions=3, replicas=2, args=["-c", "exit 0"])
    assert len(live(replicas_of(client, created["id"]))) == 2  # at most 2 at a time

    done = reconcile_until(client, created["id"], lambda d: d["state"] != "active")
    assert (done["state"], done["completed"], done["failed"], done["running"]) == (
        "completed", 3, 0, 0,
    )  # fmt: skip
    replicas = replicas_of(client, created["id"])
    assert [r["state"] for r in replicas] == ["succeeded"] * 3
    assert {r["exit_code"] for r in replicas} == {0}
    assert not Instance.objects.exclude(state="destroyed").exists()
    machines_reconcile()  # nothing more is placed once completed
    assert len(replicas_of(client, created["id"])) == 3


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_failing_job_fails_after_its_backoff_limit(funded_team, provider_team, three_hosts):
    machine_for(three_hosts[0], provider_team)
    client = key_client(funded_team)
    created = deploy(client, mode="job", completions=1, backoff_limit=1, args=["-c", "exit 1"])

    done = reconcile_until(client, created["id"], lambda d: d["state"] != "active")
    assert (done["state"], done["failed"], done["completed"]) == ("failed", 2, 0)
    replicas = replicas_of(client, created["id"])
    assert [(r["state"], r["exit_code"]) for r in replicas] == [("failed", 1), ("failed", 1)]
    machines_reconcile()
    assert len(replicas_of(client, created["id"])) == 2  # no third try


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_replicas_queue_with_a_reason_until_a_machine_is_listed(
    funded_team, provider_team, three_hosts
):
    listed = machine_for(three_hosts[0], provider_team)
    spare = machine_for(three_hosts[1], provider_team, listed=False)
    client = key_client(funded_team)
    created = deploy(
        client, replicas=2, gpus_per_replica=2, max_price_per_gpu_hour="1.50", regions=["US"]
    )
    assert (created["running"], created["queued"]) == (1, 1)
    assert created["queue_reason"] == (
        "no RTX 4090 with 2 free GPUs under $1.50/GPU-hour in US; "
        "1 machine has RTX 4090 but only 0 free"
    )
    queued = [r for r in replicas_of(client, created["id"]) if r["state"] == "queued"]
    assert queued[0]["machine_id"] is None and queued[0]["gpus"] == []
    # A queued replica holds nothing: one hold, for the placed one.
    assert Hold.objects.count() == 1

    host_services.machine_set_listed(machine_id=spare.pk, listed=True)

    deployment = client.get(f"/api/v1/deployments/{created['id']}/").json()
    assert (deployment["running"], deployment["queued"], deployment["queue_reason"]) == (2, 0, "")
    machines = {r["machine_id"] for r in live(replicas_of(client, created["id"]))}
    assert machines == {listed.pk, spare.pk}


# --- the API without hosts ------------------------------------------------------------------


@pytest.mark.django_db
def test_api_create_list_get_patch_stop_and_replicas(funded_team):
    client = key_client(funded_team)
    created = deploy(client, replicas=2, max_price_per_gpu_hour=1.2, budget_usd="20")
    assert created["max_price_per_gpu_hour"] == "1.200000"
    assert created["budget_usd"] == "20.000000"
    assert (created["desired"], created["queued"], created["running"]) == (2, 2, 0)
    assert created["queue_reason"].startswith("no RTX 4090 with 1 free GPU under $1.20/GPU-hour")
    assert client.get("/api/v1/deployments/").json()["results"][0]["id"] == created["id"]
    url = f"/api/v1/deployments/{created['id']}/"
    assert client.get(url).json()["name"] == "web"

    patched = client.patch(url, {"replicas": 3, "regions": ["EU"]}, format="json").json()
    assert (patched["desired"], patched["queued"], patched["regions"]) == (3, 3, ["EU"])
    replicas = replicas_of(client, created["id"])
    assert [r["state"] for r in replicas] == ["queued"] * 3
    assert set(replicas[0]) >= {
        "id", "state", "machine_id", "gpus", "container_name", "started_at", "ended_at",
        "exit_code",
    }  # fmt: skip

    stopped = client.post(f"{url}replicas/{replicas[0]['id']}/stop/")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    assert client.get(url).json()["queued"] == 3  # a replica set queues a replacement

    halted = client.post(f"{url}stop/").json()
    assert (halted["state"], halted["queued"], halted["desired"]) == ("stopped", 0, 0)
    assert client.patch(url, {"replicas": 1}, format="json").status_code == 400
    assert client.delete(url).status_code == 204
    assert not Deployment.objects.exists()


@pytest.mark.django_db
def test_another_teams_deployment_is_404(funded_team):
    other = TeamFactory(name="Other")
    add_member(other, UserFactory(username="other-owner"), "owner")
    fund(other)
    theirs = deploy(key_client(other))
    client = key_client(funded_team)
    url = f"/api/v1/deployments/{theirs['id']}/"
    assert client.get(url).status_code == 404
    assert client.patch(url, {"replicas": 5}, format="json").status_code == 404
    assert client.post(f"{url}stop/").status_code == 404
    assert client.get(f"{url}replicas/").status_code == 404
    assert client.delete(url).status_code == 404
    assert client.get("/api/v1/deployments/").json()["results"] == []
    assert Deployment.objects.get(pk=theirs["id"]).state == "active"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("image", "bad image name!"),
        ("env", {"NVIDIA_VISIBLE_DEVICES": "all"}),
        ("replicas", -1),
        ("gpus_per_replica", 0),
        ("max_price_per_gpu_hour", "-1"),
        ("min_reliability", "NaN"),
        ("duration_hours", 0),
        ("policy", "random"),
        ("mode", "daemonset"),
        ("entrypoint", "--privileged"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(funded_team, field, value):
    response = key_client(funded_team).post(
        "/api/v1/deployments/", {**SPEC, field: value}, format="json"
    )
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert not Deployment.objects.exists() and not Replica.objects.exists()


@pytest.mark.django_db
def test_a_read_only_key_cannot_create_or_stop(funded_team):
    from marketplace.models import ApiKey

    writer = key_client(funded_team)
    created = deploy(writer)
    reader = key_client(funded_team, access=ApiKey.Access.READ)
    assert reader.get(f"/api/v1/deployments/{created['id']}/").status_code == 200
    assert reader.post("/api/v1/deployments/", SPEC, format="json").status_code == 403
    assert reader.post(f"/api/v1/deployments/{created['id']}/stop/").status_code == 403


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_the_budget_caps_what_is_placed_and_the_sweep_places_capacity_no_event_announced(
    funded_team, provider_team, three_hosts
):
    machine_for(three_hosts[0], provider_team)
    client = key_client(funded_team)
    # One replica holds $0.50 of GPU time and under a cent of storage: one fits in $0.80.
    created = deploy(client, replicas=2, budget_usd="0.80")
    assert (created["running"], created["queued"]) == (1, 1)
    assert created["queue_reason"].startswith("the budget of $0.80 is reached: its replicas")
    assert Hold.objects.count() == 1

    # More budget, and a machine that appeared without any event (added straight to the
    # tables): the beat's sweep finds both.
    Deployment.objects.filter(pk=created["id"]).update(budget=5_000_000)
    machine_for(three_hosts[1], provider_team)
    deployments_sweep()
    deployment = client.get(f"/api/v1/deployments/{created['id']}/").json()
    assert (deployment["running"], deployment["queued"], deployment["queue_reason"]) == (2, 0, "")


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_replica_whose_machine_stops_answering_is_kept_for_the_grace_then_replaced(
    funded_team, provider_team, three_hosts, settings
):
    """Offline is no proof that the container died: the replica is kept (its instance
    unknown, its rental going on) for REPLICA_UNREACHABLE_GRACE_MINUTES, and a surge replica
    keeps the count serving elsewhere meanwhile; past the grace it is lost and its rental
    destroyed, and the surge replica is its replacement."""
    first = machine_for(three_hosts[0], provider_team)
    client = key_client(funded_team)
    created = deploy(client, replicas=1)
    [replica] = replicas_of(client, created["id"])
    assert replica["machine_id"] == first.pk
    second = machine_for(three_hosts[1], provider_team)

    with transaction.atomic():
        set_status(Machine.objects.get(pk=first.pk), "offline", "missed 3 heartbeats")

    kept = Instance.objects.get(pk=Replica.objects.get(pk=replica["id"]).instance_id)
    assert kept.state == "unknown"
    assert "missed 3 heartbeats" in kept.status_message
    deployments_sweep()
    after = {r["id"]: r for r in replicas_of(client, created["id"])}
    assert after[replica["id"]]["state"] == "running"
    assert after[replica["id"]]["unreachable_since"] is not None
    [surge] = [r for r in live(list(after.values())) if r["id"] != replica["id"]]
    assert (surge["state"], surge["machine_id"]) == ("running", second.pk)
    deployments_sweep()  # settled: no second surge
    assert len(live(replicas_of(client, created["id"]))) == 2

    settings.REPLICA_UNREACHABLE_GRACE_MINUTES = 0
    deployments_sweep()
    after = {r["id"]: r for r in replicas_of(client, created["id"])}
    assert after[replica["id"]]["state"] == "lost"
    assert after[replica["id"]]["reason"].startswith("Its machine has been offline for too long")
    assert [r["id"] for r in live(list(after.values()))] == [surge["id"]]
    # The lost replica's rental ended: nothing is charged for it any more.
    kept.refresh_from_db()
    assert kept.state in ("destroying", "destroyed")


# --- rolling updates ------------------------------------------------------------------------


def running_timeline(deployment_id: int) -> list[tuple[int, int]]:
    """After each instance event of the deployment's replicas, in order: how many of its
    instances were running, and how many held GPUs (launching or running)."""
    events = InstanceEvent.objects.filter(instance__replica__deployment_id=deployment_id).order_by(
        "created_at", "pk"
    )
    state: dict[int, str] = {}
    timeline = []
    for event in events:
        state[event.instance_id] = event.to_state
        running = sum(s == "running" for s in state.values())
        busy = sum(s in ("launching", "running") for s in state.values())
        timeline.append((running, busy))
    return timeline


def runs_new_spec(deployment_id: int) -> list[bool]:
    deployment = Deployment.objects.get(pk=deployment_id)
    current = spec_hash(deployment)
    return [
        r.spec_hash == current and r.instance.env == deployment.env
        for r in Replica.objects.filter(deployment=deployment, state="running")
    ]


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_changing_the_env_rolls_a_new_replica_running_before_an_old_one_stops(
    funded_team, provider_team, three_hosts
):
    for host in three_hosts[:2]:
        machine_for(host, provider_team)
    client = key_client(funded_team)
    created = deploy(client, replicas=2)
    assert created["running"] == 2
    first = {r["id"] for r in replicas_of(client, created["id"])}

    patched = client.patch(
        f"/api/v1/deployments/{created['id']}/", {"env": {"VERSION": "2"}}, format="json"
    )
    assert patched.status_code == 200, patched.content
    done = reconcile_until(
        client,
        created["id"],
        lambda d: d["running"] == 2 and runs_new_spec(d["id"]) == [True, True],
    )
    assert (done["queued"], done["queue_reason"]) == (0, "")

    replicas = replicas_of(client, created["id"])
    old = [r for r in replicas if r["id"] in first]
    assert {(r["state"], r["reason"]) for r in old} == {("stopped", rolling.REPLACED)}
    assert len(replicas) == 4  # two new ones, no replica failed or was placed twice
    timeline = running_timeline(created["id"])
    from_full = timeline[[running for running, _ in timeline].index(2) :]
    # Never fewer than 2 running once both ran, and never more than one extra holding GPUs.
    assert min(running for running, _ in from_full) == 2, timeline
    assert max(busy for _, busy in timeline) == 3, timeline
    assert not Instance.objects.filter(replica__state="stopped").exclude(state="destroyed")


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_without_room_for_a_surge_a_rolling_update_replaces_in_place(
    funded_team, provider_team, three_hosts
):
    machine_for(three_hosts[0], provider_team)  # 2 GPUs: no room for a third replica
    client = key_client(funded_team)
    created = deploy(client, replicas=2)
    assert created["running"] == 2
    first = {r["id"] for r in replicas_of(client, created["id"])}
    reasons: list[str] = []

    def record(sender, instance, **kwargs):
        if instance.pk == created["id"] and instance.queue_reason:
            reasons.append(instance.queue_reason)

    post_save.connect(record, sender=Deployment, dispatch_uid="rolling-reasons")
    try:
        client.patch(
            f"/api/v1/deployments/{created['id']}/",
            {"args": ["-c", QUICK_STOP[1].replace("sleep 1", "sleep 2")]},
            format="json",
        )
        reconcile_until(
            client,
            created["id"],
            lambda d: d["running"] == 2 and runs_new_spec(d["id"]) == [True, True],
        )
    finally:
        post_save.disconnect(dispatch_uid="rolling-reasons", sender=Deployment)

    assert reasons and reasons[0].startswith("rolling update, replacing in place (replica ")
    assert "no room for a replica of the new spec beside the old ones: no RTX 4090" in reasons[0]
    old = [r for r in replicas_of(client, created["id"]) if r["id"] in first]
    assert {(r["state"], r["reason"]) for r in old} == {("stopped", rolling.REPLACED_IN_PLACE)}
    # One at a time: one replica kept running throughout.
    timeline = running_timeline(created["id"])
    from_full = timeline[[running for running, _ in timeline].index(2) :]
    assert min(running for running, _ in from_full) == 1, timeline
