"""The CLI's bulk forms and the round-2 fixes of issue 35 §1, through Django's test client with
the bodies the CLI 1.9.1 sends (vastai/api/instances.py: create_instance_from_payload,
start_instance, stop_instance, destroy_instance, change_bid)."""

from __future__ import annotations

import pytest

from marketplace.models import Rental
from scheduler.models import Instance, InstanceState
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund, machine_for
from tests.vast.test_translation import CREATE, bundle, rent

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def spare(sim_host_factory, provider_team):
    return machine_for(sim_host_factory(gpus=1), provider_team)


def test_create_instances_rents_each_offer_with_the_same_settings(funded_team, machine, spare):
    client = key_client(funded_team)
    response = client.post(
        "/api/v0/asks/bulk/",
        {**CREATE, "ids": [bundle(machine).pk, bundle(spare).pk]},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["success"] is True and "failed" not in body
    instances = Instance.objects.filter(pk__in=body["new_contracts"]).order_by("pk")
    assert [i.machine_id for i in instances] == [machine.pk, spare.pk]
    assert {(i.image, i.entrypoint, tuple(i.args)) for i in instances} == {
        ("gpumkt/busybox:latest", "sh", ("-c", "echo hi"))
    }


def test_create_instances_names_what_it_could_not_rent_beside_what_it_did(
    funded_team, machine, spare
):
    client = key_client(funded_team)
    offers = [bundle(machine, 1).pk, bundle(spare, 1).pk, 999999]  # as searched a moment ago
    rent(client, spare)  # its one GPU is taken
    response = client.post("/api/v0/asks/bulk/", {**CREATE, "ids": offers}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    # Something was rented: success, so the CLI does not send the request again.
    assert body["success"] is True and len(body["new_contracts"]) == 1
    assert set(body["failed"]) == {str(offers[1]), "999999"}
    assert "There is no offer 999999" in body["failed"]["999999"]
    assert Rental.objects.filter(machine=machine).count() == 1


def test_create_instances_with_bad_settings_rents_nothing(funded_team, machine, spare):
    response = key_client(funded_team).post(
        "/api/v0/asks/bulk/",
        {**CREATE, "ids": [bundle(machine).pk, bundle(spare).pk], "env": {"-h": "x"}},
        format="json",
    )
    assert response.status_code == 400 and "'-h' is not supported" in response.json()["msg"]
    assert not Rental.objects.exists()
    empty = key_client(funded_team).post("/api/v0/asks/bulk/", {**CREATE}, format="json")
    assert empty.status_code == 400 and "ids is a list of ids" in empty.json()["msg"]


def test_stop_and_destroy_instances_act_on_each_and_again_is_no_error(funded_team, machine, spare):
    client = key_client(funded_team)
    ids = [rent(client, machine).json()["new_contract"], rent(client, spare).json()["new_contract"]]
    stopped = client.put("/api/v0/instances/", {"state": "stopped", "ids": ids}, format="json")
    assert stopped.status_code == 200, stopped.content
    assert stopped.json() == {"success": True, "done": ids}
    assert set(Instance.objects.values_list("state", flat=True)) == {InstanceState.STOPPING}
    # The CLI sends a request again when it did not read success: nothing fails the second time.
    again = client.put("/api/v0/instances/", {"state": "stopped", "ids": ids}, format="json")
    assert again.json()["success"] is True
    destroyed = client.delete("/api/v0/instances/", {"instance_ids": ids}, format="json")
    assert destroyed.status_code == 200 and destroyed.json()["success"] is True
    assert set(Instance.objects.values_list("state", flat=True)) == {InstanceState.DESTROYING}


def test_a_bulk_form_with_another_teams_id_does_nothing(funded_team, machine, spare):
    client = key_client(funded_team)
    mine = rent(client, machine).json()["new_contract"]
    other = TeamFactory(name="Other Co")
    add_member(other, UserFactory(username="other"), role="owner")
    fund(other)
    theirs = rent(key_client(other), spare).json()["new_contract"]
    for method, body in [
        ("put", {"state": "stopped", "ids": [mine, theirs]}),
        ("delete", {"instance_ids": [mine, theirs]}),
    ]:
        response = getattr(client, method)("/api/v0/instances/", body, format="json")
        assert response.status_code == 404, response.content
        assert (
            f"{theirs} is not one of your team's instances; nothing was done"
            in (response.json()["msg"])
        )
    assert set(Instance.objects.values_list("state", flat=True)) == {InstanceState.LAUNCHING}
    bad_state = client.put("/api/v0/instances/", {"state": "paused", "ids": [mine]}, format="json")
    assert bad_state.status_code == 400 and "state is" in bad_state.json()["msg"]


def test_change_bid_without_a_price_never_lowers_the_bid(funded_team, machine):
    machine.min_bid_price_per_gpu_hour = 100_000
    machine.save(update_fields=["min_bid_price_per_gpu_hour"])
    client = key_client(funded_team)
    instance_id = rent(client, machine, price=1.0).json()["new_contract"]  # $0.25 a GPU-hour
    response = client.put(
        f"/api/v0/instances/bid_price/{instance_id}/",
        {"client_id": "me", "price": None},
        format="json",
    )
    assert response.status_code == 200, response.content
    # The machine's floor ($0.10) wins too, but leaving out --price keeps the higher bid.
    assert Rental.objects.get(instance_id=instance_id).price_per_gpu_hour == 250_000


@pytest.mark.parametrize(
    "path",
    ["/get_endpoint_logs/", "/get_endpoint_workers/", "/get_autogroup_logs/", "/update_workers/"],
)
def test_the_clis_autoscaler_paths_answer_json(funded_team, path):
    """``get endpt-logs``, ``get endpt-workers``, ``get wrkgrp-logs`` and ``update workers``
    post to these paths at the site's root (vast.ai's autoscaler): an endpoint or workergroup
    the team does not have is vast's JSON 404, never the site's HTML page
    (tests/vast/test_serverless.py has the rest)."""
    body = {"workergroup_id": 1} if path == "/update_workers/" else {"id": 1}
    response = key_client(funded_team).post(path, body, format="json")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert "is not one of your team's" in response.json()["msg"]


@pytest.mark.parametrize("path", ["/api/v0/instances/0/ssh/%0A/", "/api/v0/no-such-thing/"])
def test_an_unknown_v0_path_answers_vasts_json_404(funded_team, path):
    """A path no route takes (a key id with a newline in it, found by the fuzz test) answers in
    vast's shape too, so the CLI prints our message rather than nothing."""
    response = key_client(funded_team).get(path)
    assert response.status_code == 404
    body = response.json()
    assert body["success"] is False and "/api/v0/" in body["msg"]
    assert body["error"]["message"] == body["msg"]
