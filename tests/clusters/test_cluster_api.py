"""The clusters API and console without hosts: refusals by field with nothing written, what a
read-only key may do, the actions on a cluster whose replicas wait, and the console's review
of the per-GPU rate and total hold before it creates."""

from __future__ import annotations

import pytest

from billing.usd import format_amount
from hosts.models import Gpu, Machine
from marketplace.models import ApiKey, Cluster, Deployment, Replica
from marketplace.services.offers import offer_refresh
from marketplace.services.pricing import quote_at
from tests.conftest import key_client
from tests.marketplace.conftest import fund

pytestmark = pytest.mark.django_db

# A GPU no machine has: replicas wait (queued, holding nothing), nothing is launched.
WAITING = {
    "name": "svc", "image": "busybox:latest", "gpu_names": ["No Such GPU"], "replicas": 3,
    "duration_hours": 2, "service_port": 8080,
}  # fmt: skip


@pytest.fixture
def funded(team, owner):
    fund(team)
    return team


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("replicas", 1),
        ("service_port", 70000),
        ("image", "bad image name!"),
        ("gpus_per_replica", 0),
        ("duration_hours", 0),
        ("env", {"NVIDIA_VISIBLE_DEVICES": "all"}),
        ("min_replicas", 2),  # autoscaling needs min, max and the target together
        ("name", ""),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(funded, field, value):
    response = key_client(funded).post(
        "/api/v1/clusters/", {**WAITING, field: value}, format="json"
    )
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert not Cluster.objects.exists() and not Deployment.objects.exists()
    assert not Replica.objects.exists()


def test_autoscaling_bounds_must_hold_the_replicas(funded):
    body = {**WAITING, "min_replicas": 4, "max_replicas": 6, "target_rps_per_replica": 5}
    response = key_client(funded).post("/api/v1/clusters/", body, format="json")
    assert response.status_code == 400 and "replicas" in response.json()["error"]["fields"]
    assert not Cluster.objects.exists()


def test_actions_on_a_cluster_whose_replicas_wait(funded, settings):
    settings.GATEWAY_URL = "https://gw.example.com"
    client = key_client(funded)
    created = client.post("/api/v1/clusters/", WAITING, format="json").json()
    assert (created["state"], created["running"], created["queued"]) == ("running", 0, 3)
    assert created["url"] == f"https://gw.example.com/clusters/{created['id']}/service/"
    assert "no listed machine has NO SUCH GPU" in created["queue_reason"]
    base = f"/api/v1/clusters/{created['id']}/"

    scaled = client.post(f"{base}scale/", {"replicas": 5}, format="json").json()
    assert (scaled["replicas"], scaled["queued"]) == (5, 5)
    assert client.post(f"{base}scale/", {"replicas": 1}, format="json").status_code == 400
    # The port and the replicas have their own actions, not PATCH.
    for field, value in (("service_port", 9), ("gpus_per_replica", 2), ("replicas", 4)):
        refused = client.patch(base, {field: value}, format="json")
        assert refused.status_code == 400 and field in refused.json()["error"]["fields"]
    patched = client.patch(base, {"image": "busybox:1.36"}, format="json").json()
    assert patched["image"] == "busybox:1.36"

    closed = client.delete(f"{base}endpoint/").json()
    assert (closed["url"], closed["service_port"]) == (None, None)
    opened = client.put(f"{base}endpoint/", {"port": 9000}, format="json").json()
    assert (opened["url"], opened["service_port"]) == (created["url"], 9000)
    assert client.put(f"{base}endpoint/", {"port": 0}, format="json").status_code == 400

    stopped = client.post(f"{base}stop/").json()
    assert (stopped["state"], stopped["queued"], stopped["replicas"]) == ("stopped", 0, 5)
    resumed = client.post(f"{base}resume/").json()
    assert (resumed["state"], resumed["queued"], resumed["url"]) == ("running", 5, created["url"])

    ends = Cluster.objects.get(pk=created["id"]).ends_at
    extended = client.post(f"{base}extend/", {"hours": 3}, format="json")
    assert extended.status_code == 200, extended.content
    assert (Cluster.objects.get(pk=created["id"]).ends_at - ends).total_seconds() == 3 * 3600

    reader = key_client(funded, access=ApiKey.Access.READ)
    assert reader.get(base).status_code == 200
    assert reader.post(f"{base}stop/").status_code == 403
    assert reader.post("/api/v1/clusters/", WAITING, format="json").status_code == 403

    assert client.delete(base).status_code == 204
    assert not Cluster.objects.exists() and not Deployment.objects.exists()


def test_the_console_shows_the_rate_and_hold_before_it_creates(funded, owner_client):
    machine = Machine.objects.create(
        team=funded, name="rig", address="192.0.2.7", port=22, status="online", listed=True,
        price_per_gpu_hour=750_000, storage_price_per_gb_month=100_000, cpu_cores=16,
        ram_mb=65536, disk_free_gb=200, host_key_type="ssh-ed25519", host_key="AAAA",
        host_key_fingerprint="SHA256:rig", location="US",
    )  # fmt: skip
    Gpu.objects.bulk_create(
        Gpu(machine=machine, index=i, uuid=f"GPU-{i}", name="NVIDIA A100", memory_mib=40000,
            present=True)
        for i in range(4)
    )  # fmt: skip
    offer_refresh(machine_id=machine.pk)
    form = {
        "name": "svc", "image": "busybox:latest", "gpu_names": "A100", "gpus_per_replica": "2",
        "replicas": "2", "duration_hours": "3", "disk_gb": "10", "service_port": "8080",
        "args": "httpd -f -p 8080",
    }  # fmt: skip
    review = owner_client.post("/clusters/", form)
    page = review.content.decode()
    one = quote_at(
        price_per_gpu_hour=750_000, storage_price_per_gb_month=100_000, gpu_count=2, disk_gb=10,
        hours=3,
    )  # fmt: skip
    assert review.status_code == 200 and "$0.75" in page
    assert format_amount(2 * one.total) in page and 'id="confirm-cluster"' in page
    assert not Cluster.objects.exists()  # reviewing writes nothing

    # The machine leaves the market before the confirm: the cluster is made, its replicas wait.
    Machine.objects.filter(pk=machine.pk).update(listed=False)
    offer_refresh(machine_id=machine.pk)
    created = owner_client.post("/clusters/", {**form, "confirm": "1"})
    cluster = Cluster.objects.get()
    assert created.status_code == 302 and created["Location"] == f"/clusters/{cluster.pk}/"
    assert cluster.deployment.args == ["httpd", "-f", "-p", "8080"]
    detail = owner_client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert "svc" in detail and 'id="cluster-running">0<' in detail

    bad = owner_client.post("/clusters/", {**form, "replicas": "1"})
    assert bad.status_code == 400 and "replicas" in bad.content.decode().lower()
    assert Cluster.objects.count() == 1


def test_a_cluster_ends_at_its_time_and_cannot_be_resumed(funded):
    from datetime import timedelta

    from django.utils import timezone

    from marketplace.clusters.tasks import clusters_tick

    client = key_client(funded)
    created = client.post("/api/v1/clusters/", WAITING, format="json").json()
    Cluster.objects.filter(pk=created["id"]).update(ends_at=timezone.now() - timedelta(seconds=1))
    clusters_tick()  # as the beat does
    ended = client.get(f"/api/v1/clusters/{created['id']}/").json()
    assert (ended["state"], ended["queued"]) == ("ended", 0)
    assert Deployment.objects.get(pk=created["deployment_id"]).state == "stopped"
    refused = client.post(f"/api/v1/clusters/{created['id']}/resume/")
    assert refused.status_code == 400 and "state" in refused.json()["error"]["fields"]


def test_a_clusters_deployment_is_changed_only_through_the_cluster(funded):
    """The deployments API reads a cluster's deployment but refuses to change it: a PATCH of
    its replicas or ports would step outside the cluster's bounds or break its URL."""
    client = key_client(funded)
    cluster = client.post("/api/v1/clusters/", WAITING, format="json").json()
    deployment = Cluster.objects.get(pk=cluster["id"]).deployment
    url = f"/api/v1/deployments/{deployment.pk}/"
    assert client.get(url).status_code == 200
    before = Deployment.objects.filter(pk=deployment.pk).values().get()
    for method, path, body in (
        ("patch", url, {"replicas": 9}),
        ("post", f"{url}stop/", None),
        ("delete", url, None),
    ):
        refused = getattr(client, method)(path, body, format="json")
        assert refused.status_code == 400, (method, refused.content)
        assert (
            f"/api/v1/clusters/{cluster['id']}/" in refused.json()["error"]["fields"]["cluster"][0]
        )
    assert Deployment.objects.filter(pk=deployment.pk).values().get() == before


def test_the_console_rolls_out_a_change_of_image_arguments_and_environment(funded, owner_client):
    created = key_client(funded).post("/api/v1/clusters/", WAITING, format="json").json()
    cluster = Cluster.objects.get(pk=created["id"])
    page = owner_client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert 'name="image" value="busybox:latest"' in page and 'id="roll-progress"' not in page
    url = f"/clusters/{cluster.pk}/update/"

    refused = owner_client.post(url, {"image": "bad image name!"}, follow=True)
    assert "image" in refused.content.decode().lower()
    cluster.deployment.refresh_from_db()
    assert cluster.deployment.image == "busybox:latest"  # nothing written

    changed = owner_client.post(
        url,
        {"image": "busybox:1.36", "entrypoint": "sh", "args": "-c 'echo hi'", "env": "MODE=fast"},
        follow=True,
    )
    assert "Rolling out" in changed.content.decode()
    cluster.deployment.refresh_from_db()
    assert (cluster.deployment.image, cluster.deployment.args) == (
        "busybox:1.36",
        ["-c", "echo hi"],
    )
    assert cluster.deployment.env == {"MODE": "fast"}
    # Its replicas wait for a machine: they will be placed with the new spec, nothing rolls.
    shown = owner_client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert 'name="image" value="busybox:1.36"' in shown and 'id="roll-progress"' not in shown
    assert "MODE=fast" in shown

    same = owner_client.post(url, {"image": "busybox:1.36"}, follow=True)
    assert "Nothing changed" in same.content.decode()
