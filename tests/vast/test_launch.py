"""``vastai launch instance``: the CLI 1.9.1's search and create settings in one PUT
(vastai/api/offers.py launch_instance) rent the best offer found."""

from __future__ import annotations

import pytest

from scheduler.models import Instance
from tests.conftest import key_client

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

DEFAULTS = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
            "rented": {"eq": False}}  # fmt: skip


def test_launch_instance_rents_the_best_offer_found_with_the_settings(funded_team, machine):
    client = key_client(funded_team)
    body = {
        "image": "gpumkt/busybox:latest",
        "disk": 8,
        "q": {**DEFAULTS, "num_gpus": {"eq": "1"}, "machine_id": {"eq": machine.pk},
              "order": [["score", "desc"]], "type": "on-demand", "allocated_storage": 8},
        "env": {"MARKER": "launched"},
        "label": "quick",
        "runtype": "args",
        "onstart": "sleep",
        "args": ["600"],
    }  # fmt: skip
    launched = client.put("/api/v0/launch_instance/", body, format="json")
    assert launched.status_code == 200 and launched.json()["success"], launched.content
    instance = Instance.objects.get(pk=launched.json()["new_contract"])
    assert (instance.machine_id, instance.gpu_count, instance.label) == (machine.pk, 1, "quick")
    assert instance.env == {"MARKER": "launched"} and instance.disk_gb == 8
    assert client.delete(f"/api/v0/instances/{instance.pk}/").status_code == 200


def test_launch_instance_with_nothing_found_or_a_bad_search_rents_nothing(funded_team, machine):
    client = key_client(funded_team)
    for q, status in (
        ({**DEFAULTS, "num_gpus": {"eq": 64}}, 404),
        ({"gpu_nmae": {"eq": "x"}}, 400),
        ("num_gpus=1", 400),
        (None, 400),
    ):
        body = {"image": "gpumkt/busybox:latest", "q": q}
        answer = client.put("/api/v0/launch_instance/", body, format="json")
        assert answer.status_code == status, (q, answer.content)
        assert answer.json()["success"] is False
    assert not Instance.objects.exists()
