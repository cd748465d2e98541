"""Templates: /api/v1/templates/ (a team's saved launch settings, public or private, rented
from) and vast's ``create/search/update/delete template`` and ``create instance
--template_hash`` over them, with the bodies the CLI 1.9.1 sends (vastai/api/offers.py
create_template, update_template, delete_template, search_templates)."""

from __future__ import annotations

import pytest

from marketplace.models import ApiKey, Rental, Template
from scheduler.models import Instance
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund
from tests.vast.test_translation import CREATE, rent

pytestmark = [pytest.mark.django_db]

SAVED = {
    "name": "sleeper",
    "image": "gpumkt/busybox:latest",
    "launch_mode": "entrypoint",
    "entrypoint": "sh",
    "args": ["-c", "echo from-template; exec sleep 600"],
    "env": {"MODE": "a b; $(id)"},
    "ports": [8080],
    "disk_gb": 15,
    "readme": "# Sleeper\nSleeps.",
}
# What `vastai create template --name web --image gpumkt/busybox --image_tag latest
# --env '-e MODE=fast -p 8080:8080' --onstart-cmd sh --disk_space 14.5 --readme hi --public`
# posts.
CLI_TEMPLATE = {
    "name": "web",
    "image": "gpumkt/busybox",
    "tag": "latest",
    "href": None,
    "repo": None,
    "env": "-e MODE=fast -p 8080:8080",
    "onstart": "sh",
    "jup_direct": False,
    "ssh_direct": False,
    "use_jupyter_lab": False,
    "runtype": "args",
    "use_ssh": False,
    "jupyter_dir": None,
    "docker_login_repo": None,
    "extra_filters": {
        "verified": {"eq": True},
        "external": {"eq": False},
        "rentable": {"eq": True},
    },
    "recommended_disk_space": "14.5",
    "readme": "hi",
    "readme_visible": True,
    "desc": "a web server",
    "private": False,
}


def other_team():
    other = TeamFactory(name="Other Co")
    add_member(other, UserFactory(username="other"), role="owner")
    fund(other)
    return other


# --- /api/v1/templates/ ----------------------------------------------------------------------


def test_a_team_saves_a_template_and_rents_from_it(funded_team, machine):
    client = key_client(funded_team)
    saved = client.post("/api/v1/templates/", SAVED, format="json")
    assert saved.status_code == 201, saved.content
    body = saved.json()
    assert body["mine"] is True and body["public"] is False and len(body["hash_id"]) == 32
    rented = client.post(
        f"/api/v1/templates/{body['id']}/rent/",
        {"machine_id": machine.pk, "num_gpus": 1, "duration_hours": 1, "label": "t"},
        format="json",
    )
    assert rented.status_code == 201, rented.content
    instance = Instance.objects.get(pk=rented.json()["id"])
    assert (instance.image, instance.entrypoint, instance.args, instance.env, instance.disk_gb) == (
        SAVED["image"], "sh", SAVED["args"], SAVED["env"], 15
    )  # fmt: skip
    assert [p.container_port for p in instance.port_allocations.all()] == [8080]
    assert instance.label == "t"


def test_a_rent_from_a_template_changes_what_it_gives(funded_team, machine):
    client = key_client(funded_team)
    template_id = client.post("/api/v1/templates/", SAVED, format="json").json()["id"]
    rented = client.post(
        f"/api/v1/templates/{template_id}/rent/",
        {"machine_id": machine.pk, "num_gpus": 1, "duration_hours": 1, "env": {"X": "1"}},
        format="json",
    )
    assert rented.status_code == 201, rented.content
    assert Instance.objects.get(pk=rented.json()["id"]).env == {"X": "1"}


def test_private_templates_are_the_teams_and_public_ones_everyones(funded_team, machine):
    client = key_client(funded_team)
    private = client.post("/api/v1/templates/", SAVED, format="json").json()
    public = client.post(
        "/api/v1/templates/", {**SAVED, "name": "shared", "public": True}, format="json"
    ).json()
    stranger = key_client(other_team())
    listed = stranger.get("/api/v1/templates/").json()["results"]
    assert [(t["id"], t["mine"]) for t in listed] == [(public["id"], False)]
    assert stranger.get(f"/api/v1/templates/{private['id']}/").status_code == 404
    # A public template may be rented from; only its team changes or deletes it.
    rented = stranger.post(
        f"/api/v1/templates/{public['id']}/rent/",
        {"machine_id": machine.pk, "num_gpus": 1, "duration_hours": 1},
        format="json",
    )
    assert rented.status_code == 201, rented.content
    assert (
        stranger.patch(
            f"/api/v1/templates/{public['id']}/", {"name": "mine now"}, format="json"
        ).status_code
        == 404
    )
    assert stranger.delete(f"/api/v1/templates/{public['id']}/").status_code == 404
    assert Template.objects.get(pk=public["id"]).name == "shared"


def test_bad_template_settings_name_the_field_and_save_nothing(funded_team):
    client = key_client(funded_team)
    for changes, field in [
        ({"name": ""}, "name"),
        ({"image": "two words"}, "image"),
        ({"ports": [70000]}, "ports"),
        ({"launch_mode": "vm"}, "launch_mode"),
        ({"name": "a\nb"}, "name"),
        ({"image": "BUSYBOX/busybox"}, "image"),
        ({"entrypoint": "--privileged"}, "entrypoint"),
    ]:
        response = client.post("/api/v1/templates/", {**SAVED, **changes}, format="json")
        assert response.status_code == 400, (changes, response.content)
        assert field in response.json()["error"]["fields"], response.content
    assert not Template.objects.exists()
    reader = key_client(funded_team, access=ApiKey.Access.READ)
    assert reader.post("/api/v1/templates/", SAVED, format="json").status_code == 403
    assert not Template.objects.exists()


def test_an_update_changes_the_template_and_not_what_was_rented(funded_team, machine):
    client = key_client(funded_team)
    template = client.post("/api/v1/templates/", SAVED, format="json").json()
    rented = client.post(
        f"/api/v1/templates/{template['id']}/rent/",
        {"machine_id": machine.pk, "num_gpus": 1, "duration_hours": 1},
        format="json",
    ).json()
    changed = client.patch(
        f"/api/v1/templates/{template['id']}/", {"image": "gpumkt/sshbox:latest"}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["image"] == "gpumkt/sshbox:latest"
    assert Instance.objects.get(pk=rented["id"]).image == SAVED["image"]
    assert client.delete(f"/api/v1/templates/{template['id']}/").status_code == 204
    assert Instance.objects.filter(pk=rented["id"]).exists()


# --- the vastai CLI's template commands --------------------------------------------------------


def test_create_template_translates_the_clis_body(funded_team):
    response = key_client(funded_team).post("/api/v0/template/", CLI_TEMPLATE, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["success"] is True
    template = Template.objects.get(hash_id=body["template"]["hash_id"])
    assert template.image == "gpumkt/busybox:latest" and template.public
    assert template.env == {"MODE": "fast"} and template.ports == [8080]
    assert template.entrypoint == "sh" and template.disk_gb == 15
    assert (template.readme, template.description) == ("hi", "a web server")
    assert body["template"]["env"] == "-e MODE=fast -p 8080:8080"
    assert (body["template"]["image"], body["template"]["tag"]) == ("gpumkt/busybox", "latest")


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"docker_login_repo": "docker.io"}, "--login is not supported"),
        ({"extra_filters": {"gpu_ram": {"gte": 20000}}}, "--search_params is not supported"),
        ({"env": "-h box"}, "'-h' is not supported"),
        ({"runtype": "ssh"}, "--onstart-cmd"),
        ({"name": None}, "name"),
        ({"recommended_disk_space": "lots"}, "--disk_space"),
        ({"runtype": ["args"]}, "Unknown launch type"),
        ({"onstart": 5}, "--onstart-cmd is text"),
        ({"env": "-e NVIDIA_VISIBLE_DEVICES=all"}, "set by the platform"),
    ],
)
def test_template_options_we_cannot_keep_are_refused(funded_team, changes, words):
    response = key_client(funded_team).post(
        "/api/v0/template/", {**CLI_TEMPLATE, **changes}, format="json"
    )
    assert response.status_code == 400, response.content
    assert words in response.json()["msg"]
    assert not Template.objects.exists()


def test_search_update_and_delete_template_as_the_cli_sends_them(funded_team):
    client = key_client(funded_team)
    created = client.post("/api/v0/template/", CLI_TEMPLATE, format="json").json()["template"]
    hash_id = created["hash_id"]
    found = client.get(
        "/api/v0/template/",
        {"select_cols": '["*"]', "select_filters": f'{{"hash_id": {{"eq": "{hash_id}"}}}}'},
    ).json()["templates"]
    assert [t["id"] for t in found] == [created["id"]]
    bad = client.get("/api/v0/template/", {"select_filters": '{"count_created": {"gt": 1}}'})
    assert bad.status_code == 400 and "not by count_created" in bad.json()["msg"]
    updated = client.put(
        "/api/v1/template/",
        {**CLI_TEMPLATE, "id": created["id"], "hash_id": hash_id, "name": "web2", "env": None},
        format="json",
    )
    assert updated.status_code == 200, updated.content
    template = Template.objects.get(hash_id=hash_id)
    assert template.name == "web2" and template.env == {} and template.ports == []
    stranger = key_client(other_team())
    gone = stranger.delete("/api/v0/template/", {"hash_id": hash_id}, format="json")
    assert gone.status_code == 404 and Template.objects.filter(hash_id=hash_id).exists()
    deleted = client.delete("/api/v0/template/", {"hash_id": hash_id}, format="json")
    assert deleted.status_code == 200 and deleted.json()["success"] is True
    assert not Template.objects.exists()


def test_create_instance_from_a_template_hash(funded_team, machine):
    client = key_client(funded_team)
    hash_id = client.post("/api/v0/template/", CLI_TEMPLATE, format="json").json()["template"][
        "hash_id"
    ]
    # What `vastai create instance ID --template_hash H --env '-e EXTRA=1'` puts: no image,
    # no runtype, the CLI's default disk.
    response = rent(
        client, machine, image=None, runtype=None, args=None, onstart=None, disk=10,
        template_hash_id=hash_id, env={"EXTRA": "1"},
    )  # fmt: skip
    assert response.status_code == 200, response.content
    instance = Instance.objects.get(pk=response.json()["new_contract"])
    assert instance.image == "gpumkt/busybox:latest" and instance.entrypoint == "sh"
    assert instance.env == {"MODE": "fast", "EXTRA": "1"}
    assert instance.disk_gb == 15  # the template's least disk, above the CLI's default 10
    assert [p.container_port for p in instance.port_allocations.all()] == [8080]
    unknown = rent(client, machine, template_hash_id="0" * 32)
    assert unknown.status_code == 404 and "no template" in unknown.json()["msg"]
    assert Rental.objects.count() == 1


def test_another_teams_private_template_cannot_be_rented_from(funded_team, machine):
    hash_id = (
        key_client(funded_team)
        .post("/api/v0/template/", {**CLI_TEMPLATE, "private": True}, format="json")
        .json()["template"]["hash_id"]
    )
    response = rent(key_client(other_team()), machine, **{**CREATE, "template_hash_id": hash_id})
    assert response.status_code == 404
    assert not Rental.objects.exists()
