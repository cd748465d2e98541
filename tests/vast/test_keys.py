"""``vastai show/create/delete api-key`` over our API keys, with the bodies the CLI 1.9.1 sends
(vastai/api/keys.py): vast's permission file in our two scopes, a key never making a broader
one, admins only, the secret shown once."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from marketplace.models import ApiKey, Role
from tests.conftest import key_client
from tests.factories import UserFactory, add_member

pytestmark = [pytest.mark.django_db]

RENTER_WRITE = {"api": {"instance_read": {}, "instance_write": {}, "user_read": {}}}


def test_create_api_key_maps_vasts_permissions_to_our_scopes(funded_team):
    client = key_client(funded_team)
    for permissions, access, audience in [
        (RENTER_WRITE, "write", "renter"),
        ({"api": {"machine_read": {}}}, "read", "provider"),
        ({"api": {"instance_read": {}, "machine_write": {}}}, "write", "all"),
    ]:
        response = client.post(
            "/api/v0/auth/apikeys/", {"name": "bot", "permissions": permissions}, format="json"
        )
        assert response.status_code == 200, response.content
        body = response.json()
        key = ApiKey.objects.get(pk=body["id"])
        assert (key.access, key.audience) == (access, audience)
        # The secret works, once shown: it reads the team.
        made = APIClient()
        made.credentials(HTTP_AUTHORIZATION=f"Bearer {body['key']}")
        assert made.get("/api/v0/users/current").json()["username"] == funded_team.name


def test_show_api_keys_never_shows_a_secret_and_delete_revokes(funded_team):
    client = key_client(funded_team)
    made = client.post(
        "/api/v0/auth/apikeys/", {"name": "bot", "permissions": RENTER_WRITE}, format="json"
    ).json()
    listed = client.get("/api/v0/auth/apikeys/").json()["apikeys"]
    assert made["id"] in [row["id"] for row in listed]
    assert made["key"] not in str(listed) and "key" not in listed[0]
    shown = client.get(f"/api/v0/auth/apikeys/{made['id']}/").json()
    assert shown["permissions"] == {
        "api": {
            "billing_read": {}, "billing_write": {}, "instance_read": {}, "instance_write": {},
            "user_read": {}, "user_write": {},
        }
    }  # fmt: skip
    assert client.delete(f"/api/v0/auth/apikeys/{made['id']}/").json()["success"] is True
    assert ApiKey.objects.get(pk=made["id"]).revoked_at is not None
    revoked = APIClient()
    revoked.credentials(HTTP_AUTHORIZATION=f"Bearer {made['key']}")
    assert revoked.get("/api/v0/users/current").status_code == 401


def test_a_key_makes_no_broader_key_and_only_for_an_admin(funded_team):
    renter_only = key_client(funded_team, audience=ApiKey.Audience.RENTER)
    broader = renter_only.post(
        "/api/v0/auth/apikeys/",
        {"name": "bot", "permissions": {"api": {"machine_write": {}}}},
        format="json",
    )
    assert broader.status_code == 403 and "no broader than itself" in broader.json()["msg"]
    reader = key_client(funded_team, access=ApiKey.Access.READ)
    assert (
        reader.post(
            "/api/v0/auth/apikeys/", {"name": "bot", "permissions": RENTER_WRITE}, format="json"
        ).status_code
        == 403
    )
    member = UserFactory(username="member")
    membership = add_member(funded_team, member, Role.MEMBER)
    from marketplace.services.accounts import api_key_create

    owner = funded_team.memberships.get(role=Role.OWNER)
    issued = api_key_create(membership=owner, name="m", access="write", audience="all")
    ApiKey.objects.filter(pk=issued.api_key.pk).update(created_by=member)  # a member's key
    members_key = APIClient()
    members_key.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    refused = members_key.post(
        "/api/v0/auth/apikeys/", {"name": "bot", "permissions": RENTER_WRITE}, format="json"
    )
    assert refused.status_code == 403, refused.content
    assert membership.role == Role.MEMBER
    assert ApiKey.objects.filter(name="bot").count() == 0


@pytest.mark.parametrize(
    ("permissions", "words"),
    [
        (None, "Give a permission file"),
        ({"api": {"volume_write": {}}}, "Unknown permission 'volume_write'"),
        ({"api": {"instance_read": {"constraints": {"id": 1}}}}, "constraints are not supported"),
        ({"instance_read": {}}, 'permissions is {"api"'),
    ],
)
def test_permissions_we_cannot_honour_are_refused(funded_team, permissions, words):
    response = key_client(funded_team).post(
        "/api/v0/auth/apikeys/", {"name": "bot", "permissions": permissions}, format="json"
    )
    assert response.status_code == 400 and words in response.json()["msg"]
    assert not ApiKey.objects.filter(name="bot").exists()


def test_another_teams_key_answers_404(funded_team):
    from tests.factories import TeamFactory

    other = TeamFactory(name="Other Co")
    add_member(other, UserFactory(username="other"), Role.OWNER)
    theirs = key_client(other)
    key_client(funded_team)
    mine = ApiKey.objects.filter(team=funded_team).first()
    assert theirs.get(f"/api/v0/auth/apikeys/{mine.pk}/").status_code == 404
    assert theirs.delete(f"/api/v0/auth/apikeys/{mine.pk}/").status_code == 404
    assert ApiKey.objects.get(pk=mine.pk).revoked_at is None
