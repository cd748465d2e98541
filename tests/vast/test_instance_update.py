"""``vastai update instance``: the body the CLI 1.9.1 puts (vastai/api/instances.py
update_instance) becomes a new version of the rental on its GPUs, as PATCH /api/v1/ does."""

from __future__ import annotations

import shlex

import pytest

from marketplace.models import Template
from scheduler.models import Instance
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund
from tests.marketplace.test_launch_modes import ssh_image
from tests.marketplace.test_rental_lifecycle import QUICK_STOP, rented

_ = ssh_image  # the fixture, imported for this module

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

UPDATED = "trap 'exit 0' TERM; echo updated $MARK; while :; do sleep 1; done"


def update(client, instance, **body):
    return client.put(
        f"/api/v0/instances/update_template/{instance.pk}/",
        {"id": instance.pk, **body},
        format="json",
    )


def exec_output(client, instance, command: str) -> str:
    answer = client.post(
        f"/api/v1/instances/{instance.pk}/exec/", {"command": command}, format="json"
    )
    assert answer.status_code == 200, answer.content
    return answer.json()["output"]


def test_update_instance_runs_the_new_settings_on_the_same_gpus(funded_team, machine):
    client = key_client(funded_team)
    instance = rented(client, machine)
    gpus = sorted(instance.gpu_allocations.values_list("gpu_id", flat=True))
    answer = update(
        client, instance, args=f"-c {UPDATED!r}", env={"MARK": "v2", "-p 8081:8081": "1"}
    )
    assert answer.status_code == 200 and answer.json()["success"], answer.content
    instance.refresh_from_db()
    assert instance.version == 2 and instance.state == "running", instance.status_message
    assert instance.args == ["-c", UPDATED] and instance.env["MARK"] == "v2"
    assert sorted(instance.gpu_allocations.values_list("gpu_id", flat=True)) == gpus
    assert 8081 in instance.port_allocations.values_list("container_port", flat=True)
    assert exec_output(client, instance, "echo $MARK") == "v2\n"


def test_update_instance_from_a_template_takes_its_image_and_args(funded_team, owner, machine):
    client = key_client(funded_team)
    instance = rented(client, machine)
    template = Template.objects.create(
        team=funded_team, hash_id="a" * 32, name="quick", image="gpumkt/busybox:latest",
        launch_mode="entrypoint", entrypoint="sh", args=["-c", UPDATED], env={"MARK": "t"},
    )  # fmt: skip
    answer = update(client, instance, template_hash_id=template.hash_id)
    assert answer.status_code == 200, answer.content
    instance.refresh_from_db()
    assert (instance.version, instance.args, instance.env["MARK"]) == (2, ["-c", UPDATED], "t")


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({}, 400, "image"),
        ({"args": "-c 'unclosed"}, 400, "args"),
        ({"args": ["-c", "x"]}, 400, "args"),
        ({"image": ""}, 400, "image"),
        ({"env": {"-v /:/host": "1"}}, 400, "env"),
        ({"template_hash_id": "f" * 32}, 404, None),
        ({"args": shlex.join(QUICK_STOP)}, 400, None),  # the args it runs: nothing changes
    ],
)
def test_a_bad_update_answers_and_changes_nothing(funded_team, machine, body, status, field):
    client = key_client(funded_team)
    instance = rented(client, machine)
    answer = update(client, instance, **body)
    assert answer.status_code == status, answer.content
    if field:
        assert field in answer.json()["error"]["fields"]
    after = Instance.objects.get(pk=instance.pk)
    assert (after.version, after.args, after.state) == (1, instance.args, "running")


def test_an_ssh_instance_takes_no_args_and_another_teams_instance_answers_404(
    funded_team, machine, ssh_image
):
    client = key_client(funded_team)
    instance = rented(client, machine, image=ssh_image, launch_mode="ssh", entrypoint="", args=[])
    refused = update(client, instance, args="-c true")
    assert refused.status_code == 400 and "sshd" in refused.json()["msg"]
    other = TeamFactory(name="Other Co")
    add_member(other, UserFactory(username="other"), "owner")
    fund(other)
    foreign = update(key_client(other), instance, image="gpumkt/busybox:latest")
    assert foreign.status_code == 404
    assert Instance.objects.get(pk=instance.pk).version == 1
