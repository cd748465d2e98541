"""vast.ai's serverless endpoints and workergroups over clusters, with the bodies the CLI 1.9.1
sends (vastai/api/endpoints.py), without hosts: a GPU no machine has keeps the workers queued
(holding nothing). What a refusal writes (nothing) and says (the CLI's flag) included."""

from __future__ import annotations

import pytest

from marketplace.models import Cluster, Deployment, Replica, Role, ServerlessEndpoint, Workergroup
from marketplace.services.templates import template_create
from marketplace.vast.serverless import WORKER_REQUESTS_PER_SECOND
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund

pytestmark = pytest.mark.django_db

# What `vastai create endpoint --endpoint_name llama --max_workers 6 --target_util 0.8` posts.
CREATE_ENDPOINT = {
    "client_id": "me",
    "min_load": 0.0,
    "min_cold_load": 0.0,
    "target_util": 0.8,
    "cold_mult": 2.5,
    "cold_workers": 5,
    "max_workers": 6,
    "endpoint_name": "llama",
    "max_queue_time": None,
    "target_queue_time": None,
    "inactivity_timeout": None,
    "autoscaler_instance": "prod",
}
# `vastai create workergroup --endpoint_id E --template_hash H --search_params "…"` (the CLI
# appends its default filters).
NOWHERE = "gpu_name=No_Such_GPU num_gpus=1 verified=True rentable=True rented=False"


def create_workergroup_body(endpoint_id: int, hash_id: str, search: str = NOWHERE) -> dict:
    return {
        "client_id": "me",
        "template_hash": hash_id,
        "template_id": None,
        "search_params": search,
        "launch_args": None,
        "gpu_ram": None,
        "endpoint_name": None,
        "endpoint_id": endpoint_id,
        "autoscaler_instance": "prod",
    }


@pytest.fixture
def funded(team, owner):
    fund(team)
    return team


@pytest.fixture
def template(funded):
    return template_create(
        team=funded,
        user=None,
        fields={
            "name": "server",
            "image": "busybox:latest",
            "entrypoint": "sh",
            "args": ["-c", "exec httpd -f -p 8080"],
            "env": {"MODE": "serve"},
            "ports": [8080],
            "disk_gb": 12,
        },
    )


def counts() -> tuple[int, ...]:
    return tuple(
        m.objects.count() for m in (ServerlessEndpoint, Workergroup, Cluster, Deployment, Replica)
    )


def test_an_endpoint_and_its_workergroup_make_an_autoscaled_cluster(funded, template):
    client = key_client(funded)
    made = client.post("/api/v0/endptjobs/", CREATE_ENDPOINT, format="json").json()
    assert made["success"] is True
    endpoint_id = made["result"]
    shown = client.get("/api/v0/endptjobs/", {"client_id": "me"}).json()
    assert shown["success"] is True
    assert [(r["id"], r["endpoint_name"], r["max_workers"]) for r in shown["results"]] == [
        (endpoint_id, "llama", 6)
    ]
    assert shown["results"][0]["cluster_id"] is None  # no workergroup, no workers yet

    body = create_workergroup_body(endpoint_id, template.hash_id)
    group = client.post("/api/v0/autojobs/", body, format="json").json()
    assert group["success"] is True
    cluster = Cluster.objects.get(workergroup__pk=group["id"])
    deployment = cluster.deployment
    assert (cluster.min_replicas, cluster.max_replicas, cluster.replicas) == (2, 6, 2)
    assert cluster.target_rps_per_replica == pytest.approx(0.8 * WORKER_REQUESTS_PER_SECOND)
    assert cluster.service_port == 8080
    assert (deployment.name, deployment.image, deployment.entrypoint) == (
        "llama",
        "busybox:latest",
        "sh",
    )
    assert deployment.args == ["-c", "exec httpd -f -p 8080"]
    assert deployment.env == {"MODE": "serve"} and deployment.disk_gb == 12
    assert deployment.gpu_names == ["No Such GPU"] and deployment.gpus_per_replica == 1

    groups = client.get("/api/v0/autojobs/").json()["results"]
    assert [(g["id"], g["endpoint_id"], g["template_hash"]) for g in groups] == [
        (group["id"], endpoint_id, template.hash_id)
    ]
    assert "NO SUCH GPU" in groups[0]["queue_reason"]

    workers = client.post("/get_endpoint_workers/", {"id": endpoint_id}, format="json").json()
    assert [w["status"] for w in workers] == ["queued", "queued"]
    assert all(w["id"] is None for w in workers)  # no instance while queued
    logs = client.post("/get_endpoint_logs/", {"id": endpoint_id}, format="json").json()
    assert logs["info1"] == "No workers are placed yet."

    # update endpoint: the cluster's bounds, name and state follow.
    changed = client.put(
        f"/api/v0/endptjobs/{endpoint_id}/",
        {"endptjob_id": endpoint_id, "max_workers": 9, "endpoint_state": "stopped",
         "endpoint_name": "llama-2", "target_util": 0.5},
        format="json",
    )  # fmt: skip
    assert changed.status_code == 200, changed.content
    cluster.refresh_from_db()
    assert (cluster.max_replicas, cluster.state, cluster.deployment.name) == (
        9,
        "stopped",
        "llama-2",
    )
    assert cluster.target_rps_per_replica == pytest.approx(0.5 * WORKER_REQUESTS_PER_SECOND)
    assert client.post("/get_endpoint_workers/", {"id": endpoint_id}, format="json").json() == []

    # delete endpoint: the cluster and the workergroup go with it.
    gone = client.delete(f"/api/v0/endptjobs/{endpoint_id}/", format="json")
    assert gone.status_code == 200 and gone.json()["success"] is True
    assert counts()[:3] == (0, 0, 0)


def test_update_workers_rolls_the_templates_new_settings(funded, template):
    client = key_client(funded)
    endpoint_id = client.post("/api/v0/endptjobs/", CREATE_ENDPOINT, format="json").json()["result"]
    group_id = client.post(
        "/api/v0/autojobs/", create_workergroup_body(endpoint_id, template.hash_id), format="json"
    ).json()["id"]
    same = client.post("/update_workers/", {"workergroup_id": group_id}, format="json").json()
    assert same == {"success": True, "workers_to_update": 0}
    template.image = "busybox:1.36"
    template.save()
    rolled = client.post("/update_workers/", {"workergroup_id": group_id}, format="json").json()
    assert rolled["success"] is True and rolled["workers_to_update"] == 2
    assert Cluster.objects.get().deployment.image == "busybox:1.36"
    cancel = client.post(
        "/update_workers/", {"workergroup_id": group_id, "cancel_update": True}, format="json"
    )
    assert cancel.status_code == 400 and "--cancel" in cancel.json()["msg"]

    # update workergroup: new placement conditions reach the deployment.
    updated = client.put(
        f"/api/v0/autojobs/{group_id}/",
        {"autojob_id": group_id, "search_params": "gpu_name in [A100,H100] num_gpus=2"},
        format="json",
    )
    assert updated.status_code == 200, updated.content
    deployment = Cluster.objects.get().deployment
    assert (deployment.gpu_names, deployment.gpus_per_replica) == (["A100", "H100"], 2)
    # Left out, the CLI sends its default filters alone: the conditions stay as they were.
    kept = client.put(
        f"/api/v0/autojobs/{group_id}/",
        {"autojob_id": group_id, "search_params": "verified=True rentable=True rented=False"},
        format="json",
    )
    assert kept.json()["workergroup"]["search_params"] == "gpu_name in [A100,H100] num_gpus=2"
    # A search replaces them all: no GPU count named is one GPU again.
    client.put(f"/api/v0/autojobs/{group_id}/", {"search_params": "geolocation=EU"}, format="json")
    deployment.refresh_from_db()
    assert (deployment.gpu_names, deployment.gpus_per_replica, deployment.regions) == (
        [],
        1,
        ["EU"],
    )

    # delete workergroup: the cluster goes, the endpoint stays.
    assert client.delete(f"/api/v0/autojobs/{group_id}/", format="json").status_code == 200
    assert counts()[:3] == (1, 0, 0)


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"cold_workers": 0}, "cold_workers"),
        ({"cold_mult": 1.0}, "cold_mult"),
        ({"min_load": 100.0}, "min_load"),
        ({"min_cold_load": 5.0}, "min_cold_load"),
        ({"max_queue_time": 30.0}, "max_queue_time"),
        ({"inactivity_timeout": 60}, "inactivity_timeout"),
        ({"max_workers": 1}, "max_workers"),
        ({"max_workers": 10**9}, "max_workers"),
        ({"max_workers": "lots"}, "max_workers"),
        ({"target_util": 1.5}, "target_util"),
        ({"target_util": float("nan")}, "target_util"),
        ({"endpoint_name": ""}, "endpoint_name"),
        ({"endpoint_name": "a\x00b"}, "endpoint_name"),
        ({"endpoint_name": None}, "endpoint_name"),
        ({"autoscaler_instance": "dev"}, "auto_instance"),
    ],
)
def test_create_endpoint_refuses_what_does_not_translate(funded, change, flag):
    body = {**CREATE_ENDPOINT, **change}
    if change.get("target_util") != change.get("target_util"):  # NaN is no JSON: as text
        response = key_client(funded).post(
            "/api/v0/endptjobs/",
            data='{"max_workers": 4, "endpoint_name": "x", "target_util": NaN}',
            content_type="application/json",
        )
    else:
        response = key_client(funded).post("/api/v0/endptjobs/", body, format="json")
    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["success"] is False and answer["msg"]
    if change.get("target_util") == change.get("target_util"):
        assert flag in answer["error"]["fields"], answer
    assert counts() == (0, 0, 0, 0, 0)


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"launch_args": "--image evil --disk 64"}, "launch_args"),
        ({"gpu_ram": 24.0}, "gpu_ram"),
        ({"search_params": "gpu_ram>=23 verified=True"}, "search_params"),
        ({"search_params": "cpu_cores>=8"}, "search_params"),
        ({"search_params": "num_gpus>=2"}, "search_params"),
        ({"search_params": "gpu_name=X -o dph_total"}, "search_params"),
        ({"search_params": "gpu_name=$(reboot)\x01"}, "search_params"),
        ({"search_params": ["gpu_name=X"]}, "search_params"),
        ({"template_hash": 7}, "template_hash"),
        ({"template_hash": None}, "template_hash"),
        ({"endpoint_id": "1; drop"}, "endpoint_id"),
        ({"endpoint_id": True}, "endpoint_id"),
    ],
)
def test_create_workergroup_refuses_what_does_not_translate(funded, template, change, flag):
    endpoint = ServerlessEndpoint.objects.create(
        team=funded, name="e", max_workers=4, target_util=0.9
    )
    body = {**create_workergroup_body(endpoint.pk, template.hash_id), **change}
    response = key_client(funded).post("/api/v0/autojobs/", body, format="json")
    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["success"] is False and flag in answer["error"]["fields"], answer
    assert counts() == (1, 0, 0, 0, 0)


def test_a_workergroup_needs_an_args_template_with_one_port(funded, template):
    endpoint = ServerlessEndpoint.objects.create(
        team=funded, name="e", max_workers=4, target_util=0.9
    )
    client = key_client(funded)
    for fields in ({"launch_mode": "ssh", "ports": []}, {"ports": [80, 81]}):
        other = template_create(
            team=funded, user=None, fields={"name": "t", "image": "busybox:latest", **fields}
        )
        body = create_workergroup_body(endpoint.pk, other.hash_id)
        response = client.post("/api/v0/autojobs/", body, format="json")
        assert response.status_code == 400 and "template_hash" in response.json()["error"]["fields"]
    first = client.post(
        "/api/v0/autojobs/", create_workergroup_body(endpoint.pk, template.hash_id), format="json"
    )
    assert first.status_code == 200
    second = client.post(
        "/api/v0/autojobs/", create_workergroup_body(endpoint.pk, template.hash_id), format="json"
    )
    assert second.status_code == 400 and "endpoint_id" in second.json()["error"]["fields"]
    assert counts()[:3] == (1, 1, 1)


def test_another_teams_endpoint_and_private_template_answer_404(funded, template):
    theirs = TeamFactory()
    add_member(theirs, UserFactory(), Role.OWNER)
    fund(theirs)
    mine = ServerlessEndpoint.objects.create(team=funded, name="e", max_workers=4, target_util=0.9)
    other = key_client(theirs)
    own = ServerlessEndpoint.objects.create(team=theirs, name="o", max_workers=4, target_util=0.9)
    # Their workergroup on my endpoint, or on theirs from my private template: 404.
    for body in (
        create_workergroup_body(mine.pk, template.hash_id),
        create_workergroup_body(own.pk, template.hash_id),
    ):
        response = other.post("/api/v0/autojobs/", body, format="json")
        assert response.status_code == 404 and response.json()["success"] is False
    for method, url, body in [
        ("put", f"/api/v0/endptjobs/{mine.pk}/", {"max_workers": 3}),
        ("delete", f"/api/v0/endptjobs/{mine.pk}/", {}),
        ("post", "/get_endpoint_workers/", {"id": mine.pk}),
        ("post", "/get_endpoint_logs/", {"id": mine.pk}),
    ]:
        response = getattr(other, method)(url, body, format="json")
        assert response.status_code == 404, (url, response.content)
        assert f"Endpoint {mine.pk} is not one of your team's" in response.json()["msg"]
    mine.refresh_from_db()
    assert mine.max_workers == 4
    assert counts() == (2, 0, 0, 0, 0)


def test_the_autoscaler_paths_need_a_key_and_an_id(funded):
    anonymous = key_client(funded)
    anonymous.credentials()
    assert anonymous.post("/get_endpoint_workers/", {"id": 1}, format="json").status_code in (
        401,
        403,
    )
    client = key_client(funded)
    for url, body in [
        ("/get_endpoint_workers/", {"id": "1 OR 1=1"}),
        ("/get_endpoint_logs/", {"id": None}),
        ("/get_autogroup_logs/", {"id": -1}),
        ("/update_workers/", {"workergroup_id": 1.5}),
        ("/get_endpoint_logs/", ["not", "an", "object"]),
    ]:
        response = client.post(url, body, format="json")
        assert response.status_code == 400, (url, response.content)
        assert response.json()["success"] is False
