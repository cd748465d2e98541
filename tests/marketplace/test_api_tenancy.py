"""The API's keys, permissions, error format and schema."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.models import ApiKey, Membership, Role
from marketplace.services.tenancy import api_key_create, api_key_revoke
from tests.conftest import key_client

pytestmark = pytest.mark.django_db


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def owner_membership(team, owner):
    return Membership.objects.get(team=team, user=owner)


def test_key_is_stored_only_as_a_hash(owner_membership):
    issued = api_key_create(membership=owner_membership, name="ci", access="write")
    row = ApiKey.objects.filter(pk=issued.api_key.pk).values().get()
    assert issued.secret.startswith(f"gpk_{row['prefix']}_")
    assert all(issued.secret not in str(value) for value in row.values())
    assert row["key_hash"] == ApiKey.hash_secret(issued.secret)


def test_valid_key_acts_for_its_team_and_records_last_use(owner_membership, team):
    issued = api_key_create(membership=owner_membership, name="ci")
    response = bearer(issued.secret).get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["team"]["id"] == team.id
    assert response.json()["api_key"]["access"] == "read"
    issued.api_key.refresh_from_db()
    assert issued.api_key.last_used_at is not None


@pytest.mark.parametrize("how", ["revoked", "expired", "wrong secret", "unknown prefix", "garbage"])
def test_unusable_keys_get_401_in_the_error_format(owner_membership, how):
    issued = api_key_create(membership=owner_membership, name="ci", access="write")
    secret = issued.secret
    if how == "revoked":
        api_key_revoke(membership=owner_membership, api_key=issued.api_key)
    elif how == "expired":
        ApiKey.objects.filter(pk=issued.api_key.pk).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
    elif how == "wrong secret":
        secret = secret[:-3] + ("aaa" if not secret.endswith("aaa") else "bbb")
    elif how == "unknown prefix":
        secret = "gpk_ffffffff_" + secret.split("_", 2)[2]
    else:
        secret = "not-a-key; rm -rf /"
    response = bearer(secret).get("/api/v1/me/")
    assert response.status_code == 401
    body = response.json()
    assert body["error"]["code"] == "authentication_failed"
    assert "revoked or expired" in body["error"]["message"]


def test_no_credentials_get_401_with_bearer_challenge():
    response = APIClient().get("/api/v1/me/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["error"]["code"] == "not_authenticated"


def test_read_only_key_cannot_write(team, owner):
    client = key_client(team, access=ApiKey.Access.READ)
    assert client.get("/api/v1/me/").status_code == 200
    response = client.post(
        "/api/v1/api-keys/", {"name": "sneaky", "access": "write"}, format="json"
    )
    assert response.status_code == 403
    assert ApiKey.objects.filter(name="sneaky").count() == 0


def test_keys_cannot_mint_keys_or_manage_members(team, owner):
    client = key_client(team, access=ApiKey.Access.WRITE)
    response = client.post("/api/v1/api-keys/", {"name": "child"}, format="json")
    assert response.status_code == 403
    assert "console" in response.json()["error"]["message"]
    assert not ApiKey.objects.filter(name="child").exists()


def test_session_admin_creates_key_through_api_shown_once(client, team, owner):
    client.force_login(owner)
    response = client.post(
        "/api/v1/api-keys/",
        {"name": "bot", "access": "write", "audience": "provider"},
        content_type="application/json",
    )
    assert response.status_code == 201
    secret = response.json()["key"]
    assert bearer(secret).get("/api/v1/me/").json()["api_key"]["audience"] == "provider"
    listed = client.get("/api/v1/api-keys/").json()["results"]
    assert [k["name"] for k in listed] == ["bot"]
    assert "key" not in listed[0]


def test_bad_key_input_names_the_field(client, team, owner):
    client.force_login(owner)
    response = client.post(
        "/api/v1/api-keys/",
        {"name": "", "access": "root", "expires_at": "yesterday"},
        content_type="application/json",
    )
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert set(fields) == {"name", "access", "expires_at"}
    assert ApiKey.objects.count() == 0


def test_expiry_in_the_past_is_refused(client, team, owner):
    client.force_login(owner)
    past = (timezone.now() - timedelta(days=1)).isoformat()
    response = client.post(
        "/api/v1/api-keys/", {"name": "old", "expires_at": past}, content_type="application/json"
    )
    assert response.status_code == 400
    assert "future" in response.json()["error"]["fields"]["expires_at"][0]
    assert ApiKey.objects.count() == 0


def test_member_role_cannot_create_keys(client, team, teammate):
    client.force_login(teammate)
    session = client.session
    session["active_team_id"] = team.id
    session.save()
    response = client.post("/api/v1/api-keys/", {"name": "x"}, content_type="application/json")
    assert response.status_code == 403
    assert "admin role" in response.json()["error"]["message"]


def test_outsider_sees_no_keys_or_members_and_gets_404_on_ids(
    client, team, owner, teammate, outsider
):
    key = api_key_create(
        membership=Membership.objects.get(team=team, user=owner), name="team key"
    ).api_key
    member = Membership.objects.get(team=team, user=teammate)
    client.force_login(outsider)
    assert client.get("/api/v1/api-keys/").json()["results"] == []
    members = client.get("/api/v1/team/members/").json()["results"]
    assert [m["username"] for m in members] == ["outsider"]
    assert client.get(f"/api/v1/api-keys/{key.pk}/").status_code == 404
    assert client.delete(f"/api/v1/api-keys/{key.pk}/").status_code == 404
    assert (
        client.patch(
            f"/api/v1/team/members/{member.pk}/",
            {"role": "viewer"},
            content_type="application/json",
        ).status_code
        == 404
    )
    key.refresh_from_db()
    member.refresh_from_db()
    assert key.revoked_at is None and member.role == Role.MEMBER


def test_teammate_lists_the_same_members_as_owner(client, team, owner, teammate):
    client.force_login(teammate)
    session = client.session
    session["active_team_id"] = team.id
    session.save()
    names = sorted(m["username"] for m in client.get("/api/v1/team/members/").json()["results"])
    assert names == ["owner", "teammate"]


def test_key_of_one_team_never_sees_another_team(team, owner, outsider):
    client = key_client(team)
    members = client.get("/api/v1/me/").json()
    assert members["team"]["id"] == team.id


def test_revoking_twice_keeps_the_first_time(owner_membership):
    key = api_key_create(membership=owner_membership, name="k").api_key
    first = api_key_revoke(membership=owner_membership, api_key=key).revoked_at
    second = api_key_revoke(membership=owner_membership, api_key=key).revoked_at
    assert first == second


def test_schema_and_docs_are_served(client, owner):
    schema = APIClient().get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    body = schema.json()
    assert body["openapi"].startswith("3.")
    assert "/api/v1/api-keys/" in body["paths"]
    docs = APIClient().get("/api/v1/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_unknown_api_path_answers_json_404():
    response = APIClient().get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
