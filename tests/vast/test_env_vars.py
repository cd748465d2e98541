"""The team's environment variables: /api/v1/env-vars/ and vast's ``show/create/update/delete
env-var`` (``/secrets/``, the bodies vastai/api/auth.py sends). Values are sealed at rest,
never shown back, and given to every new instance of the team (its own env wins a name)."""

from __future__ import annotations

import pytest

from marketplace import secrets_box
from marketplace.models import ApiKey, TeamEnvVar
from marketplace.services.env_vars import team_launch_env
from scheduler.models import Instance
from scheduler.services import container_spec_for
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.vast.test_translation import rent

pytestmark = [pytest.mark.django_db]


def test_create_env_var_seals_the_value_and_never_shows_it(funded_team):
    client = key_client(funded_team)
    created = client.post(
        "/api/v0/secrets/", {"key": "HF_TOKEN", "value": "hf_s3cret value"}, format="json"
    )
    assert created.status_code == 200 and created.json()["success"] is True
    stored = TeamEnvVar.objects.get(team=funded_team)
    assert "hf_s3cret" not in stored.sealed_value
    assert secrets_box.unseal(stored.sealed_value) == "hf_s3cret value"
    shown = client.get("/api/v0/secrets/")
    assert shown.json() == {"secrets": {"HF_TOKEN": "*****"}}
    listed = client.get("/api/v1/env-vars/")
    assert listed.status_code == 200 and "hf_s3cret" not in listed.content.decode()
    assert [row["name"] for row in listed.json()] == ["HF_TOKEN"]


def test_update_and_delete_env_var(funded_team):
    client = key_client(funded_team)
    client.post("/api/v0/secrets/", {"key": "A", "value": "1"}, format="json")
    again = client.post("/api/v0/secrets/", {"key": "A", "value": "2"}, format="json")
    assert again.status_code == 400 and "update it instead" in again.json()["msg"]
    updated = client.put("/api/v0/secrets/", {"key": "A", "value": "2"}, format="json")
    assert updated.status_code == 200
    assert team_launch_env(funded_team.pk) == {"A": "2"}
    missing = client.put("/api/v0/secrets/", {"key": "B", "value": "2"}, format="json")
    assert missing.status_code == 404 and "B is not set" in missing.json()["msg"]
    assert client.delete("/api/v0/secrets/", {"key": "A"}, format="json").status_code == 200
    assert not TeamEnvVar.objects.exists()
    assert client.delete("/api/v0/secrets/", {"key": "A"}, format="json").status_code == 404


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("1BAD", "x", "not a variable name"),
        ("NVIDIA_VISIBLE_DEVICES", "all", "set by the platform"),
        ("GOOD", "nul \x00 char", "value"),
        ("GOOD", "x" * 5000, "4096"),
        ("A" * 129, "x", "128"),
    ],
)
def test_bad_env_vars_are_refused_naming_why(funded_team, name, value, words):
    response = key_client(funded_team).post(
        "/api/v1/env-vars/", {"name": name, "value": value}, format="json"
    )
    assert response.status_code == 400, response.content
    assert words in response.json()["error"]["message"]
    assert not TeamEnvVar.objects.exists()


def test_env_vars_are_the_teams_and_a_read_key_cannot_set_them(funded_team):
    key_client(funded_team).post("/api/v1/env-vars/", {"name": "A", "value": "1"}, format="json")
    other = TeamFactory(name="Other Co")
    add_member(other, UserFactory(username="other"), role="owner")
    stranger = key_client(other)
    assert stranger.get("/api/v0/secrets/").json() == {"secrets": {}}
    assert stranger.delete("/api/v1/env-vars/A/").status_code == 404
    assert stranger.patch("/api/v1/env-vars/A/", {"value": "x"}, format="json").status_code == 404
    reader = key_client(funded_team, access=ApiKey.Access.READ)
    assert (
        reader.post("/api/v0/secrets/", {"key": "B", "value": "1"}, format="json").status_code
        == 403
    )
    assert team_launch_env(funded_team.pk) == {"A": "1"}


def test_a_new_instance_gets_the_teams_variables_under_its_own_env(funded_team, machine):
    client = key_client(funded_team)
    for name, value in [("HF_TOKEN", "s3cret"), ("K", "from-team")]:
        client.post("/api/v1/env-vars/", {"name": name, "value": value}, format="json")
    instance = Instance.objects.get(pk=rent(client, machine).json()["new_contract"])  # env K=V
    spec = container_spec_for(instance, team_env=team_launch_env(funded_team.pk))
    assert spec.env == {"HF_TOKEN": "s3cret", "K": "V"}
    # The instance shows its own env, never the team's secrets.
    row = client.get(f"/api/v0/instances/{instance.pk}/").json()["instances"]
    assert "s3cret" not in str(row)
