"""``vastai update ssh-key <id> <public key>``: PUT /ssh/<id>/ {"id", "ssh_key"} (CLI 1.9.1,
vastai/api/keys.py update_ssh_key)."""

from __future__ import annotations

import pytest

from marketplace.models import SshKey
from marketplace.services.ssh_keys import ssh_key_add
from tests.conftest import key_client
from tests.factories import TeamFactory

pytestmark = pytest.mark.django_db

OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@box"
NEW = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPn6vG2k7o1dI7sV0xKc9QmVq0I3lB3Zt2s5mWvX8qYh new@box"


def test_update_ssh_key_replaces_the_public_key_of_the_teams_key(funded_team):
    key = ssh_key_add(team=funded_team, name="laptop", public_key=OLD)
    client = key_client(funded_team)
    answer = client.put(f"/api/v0/ssh/{key.pk}/", {"id": key.pk, "ssh_key": NEW}, format="json")
    assert answer.status_code == 200 and answer.json()["success"], answer.content
    key.refresh_from_db()
    assert (key.name, key.public_key) == ("laptop", NEW)


def test_update_ssh_key_refusals_change_nothing(funded_team):
    key = ssh_key_add(team=funded_team, name="laptop", public_key=OLD)
    other = ssh_key_add(team=funded_team, name="desk", public_key=NEW)
    theirs = ssh_key_add(team=TeamFactory(), name="x", public_key=NEW)
    client = key_client(funded_team)
    before = list(SshKey.objects.order_by("pk").values())
    for pk, body, status, field in (
        (key.pk, {"ssh_key": 5}, 400, "ssh_key"),
        (key.pk, {"ssh_key": "ssh-ed25519 AAAA broken"}, 400, "public_key"),
        (key.pk, {"ssh_key": NEW}, 400, "public_key"),  # the team's other key already
        (theirs.pk, {"ssh_key": OLD}, 404, None),
    ):
        answer = client.put(f"/api/v0/ssh/{pk}/", body, format="json")
        assert answer.status_code == status, (body, answer.content)
        assert answer.json()["success"] is False
        if field:
            assert field in answer.json()["error"]["fields"]
    assert list(SshKey.objects.order_by("pk").values()) == before
    assert other.public_key == NEW
