"""The API's keys, permissions, error format and schema."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import path
from django.utils import timezone
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.test import APIClient

from billing.models import Hold, TopUp
from hosts.models import Machine
from marketplace import urls as project_urls
from marketplace.models import ApiKey, Invitation, Membership, Role, SshKey, User
from marketplace.services.accounts import (
    api_key_create,
    api_key_revoke,
    membership_remove,
    membership_set_role,
)
from marketplace.services.ssh_keys import ssh_key_add
from scheduler.models import Instance
from tests.conftest import client_for, key_client
from tests.factories import UserFactory, add_member
from tests.marketplace.test_tenancy_matrix import build_world, public_key

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


def test_read_only_key_cannot_write_where_a_write_key_can(team, owner):
    read = key_client(team, access=ApiKey.Access.READ)
    assert read.get("/api/v1/ssh-keys/").status_code == 200
    body = {"name": "laptop", "public_key": public_key()}
    response = read.post("/api/v1/ssh-keys/", body, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "This API key is read-only."
    assert not SshKey.objects.filter(team=team).exists()
    write = key_client(team, access=ApiKey.Access.WRITE)
    assert write.post("/api/v1/ssh-keys/", body, format="json").status_code == 201
    assert SshKey.objects.get(team=team).name == "laptop"


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
    theirs = Membership.objects.get(user=outsider).team
    their_ssh_key = ssh_key_add(team=theirs, name="their laptop", public_key=public_key())
    client = key_client(team)
    assert client.get("/api/v1/me/").json()["team"]["id"] == team.id
    listed = client.get("/api/v1/ssh-keys/").json()["results"]
    assert their_ssh_key.pk not in [k["id"] for k in listed]
    assert client.delete(f"/api/v1/ssh-keys/{their_ssh_key.pk}/").status_code == 404
    assert SshKey.objects.filter(pk=their_ssh_key.pk).exists()
    # And the other way round: the outsider's key sees only the outsider's team.
    own_key = key_client(theirs)
    assert [k["id"] for k in own_key.get("/api/v1/ssh-keys/").json()["results"]] == [
        their_ssh_key.pk
    ]


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


# --- offer search by POST is a read ----------------------------------------------------------


def test_offer_search_by_post_is_a_read_for_read_only_keys_and_viewers(client, team, owner):
    read = key_client(team, access=ApiKey.Access.READ)
    response = read.post("/api/v1/offers/", {"num_gpus": {"gte": 1}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["offers"] == []
    viewer = UserFactory(username="viewer")
    add_member(team, viewer, Role.VIEWER)
    session = client_for(client, viewer, team)
    response = session.post(
        "/api/v1/offers/", {"q": "num_gpus>=1"}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    # The marker is per view: other POSTs stay writes for the viewer and the read key.
    body = {"name": "laptop", "public_key": public_key()}
    assert (
        session.post("/api/v1/ssh-keys/", body, content_type="application/json").status_code == 403
    )
    assert read.post("/api/v1/ssh-keys/", body, format="json").status_code == 403
    assert not SshKey.objects.exists()


# --- an API key acts with at most its creator's current role ---------------------------------


@pytest.fixture
def admin(team):
    user = UserFactory(username="admin")
    add_member(team, user, Role.ADMIN)
    return user


def never_rented_machine(team) -> Machine:
    return Machine.objects.create(team=team, name="spare", address="192.0.2.50", port=22)


def test_key_loses_what_its_creator_loses_when_demoted(team, owner, admin):
    issued = api_key_create(
        membership=Membership.objects.get(team=team, user=admin), name="ops", access="write",
        audience="all",
    )  # fmt: skip
    client = bearer(issued.secret)
    assert client.get("/api/v1/me/").json()["role"] == "admin"
    first, second = (
        never_rented_machine(team),
        Machine.objects.create(team=team, name="spare 2", address="192.0.2.51", port=22),
    )
    assert client.delete(f"/api/v1/machines/{first.pk}/").status_code == 204
    assert not Machine.objects.filter(pk=first.pk).exists()

    membership_set_role(
        actor=Membership.objects.get(team=team, user=owner),
        target=Membership.objects.get(team=team, user=admin),
        role=Role.MEMBER,
    )
    response = client.delete(f"/api/v1/machines/{second.pk}/")
    assert response.status_code == 403
    assert "current role (member)" in response.json()["error"]["message"]
    assert Machine.objects.filter(pk=second.pk).exists()
    assert client.get("/api/v1/me/").json()["role"] == "member"
    # Member work still goes through: the key is limited, not dead.
    body = {"name": "laptop", "public_key": public_key()}
    assert client.post("/api/v1/ssh-keys/", body, format="json").status_code == 201


def test_read_key_acts_as_a_viewer_whoever_made_it(team, owner):
    client = key_client(team, access=ApiKey.Access.READ)
    assert client.get("/api/v1/me/").json()["role"] == "viewer"
    machine = never_rented_machine(team)
    assert client.delete(f"/api/v1/machines/{machine.pk}/").status_code == 403
    assert Machine.objects.filter(pk=machine.pk).exists()


@pytest.mark.parametrize("how", ["removed", "deactivated", "deleted"])
def test_key_stops_working_when_its_creator_leaves_the_team(team, owner, admin, how):
    issued = api_key_create(
        membership=Membership.objects.get(team=team, user=admin), name="ops", access="write"
    )
    client = bearer(issued.secret)
    assert client.get("/api/v1/me/").status_code == 200
    if how == "removed":
        membership_remove(
            actor=Membership.objects.get(team=team, user=owner),
            target=Membership.objects.get(team=team, user=admin),
        )
    elif how == "deactivated":
        User.objects.filter(pk=admin.pk).update(is_active=False)
    else:
        admin.delete()
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == "authentication_failed"
    assert "no longer in Acme GPUs" in error["message"]
    # The owner's keys are untouched.
    assert key_client(team).get("/api/v1/me/").status_code == 200


def test_api_keys_page_marks_a_key_whose_creator_left(client, team, owner, admin):
    api_key_create(membership=Membership.objects.get(team=team, user=admin), name="orphan")
    membership_remove(
        actor=Membership.objects.get(team=team, user=owner),
        target=Membership.objects.get(team=team, user=admin),
    )
    page = client_for(client, owner, team).get("/team/api-keys/").content.decode()
    assert "stopped: creator left" in page


# --- viewers read and never write, in the API ------------------------------------------------


def test_viewer_reads_through_the_api_but_cannot_rent_stop_top_up_or_add_keys(
    client, team, owner, outsider
):
    viewer = UserFactory(username="viewer")
    add_member(team, viewer, Role.VIEWER)
    world = build_world(
        tag="acme", team=team, admin=Membership.objects.get(team=team, user=owner),
        member=Membership.objects.get(team=team, user=viewer), n=20, dollars=100,
    )  # fmt: skip
    session = client_for(client, viewer, team)
    for url in ["/api/v1/instances/", "/api/v1/ssh-keys/", "/api/v1/billing/balance/",
                f"/api/v1/instances/{world.instance.pk}/", "/api/v1/machines/"]:  # fmt: skip
        assert session.get(url).status_code == 200, url
    writes = [
        ("/api/v1/instances/", {"machine_id": world.machine.pk, "num_gpus": 1,
                                "image": "busybox", "duration_hours": 1}),
        (f"/api/v1/instances/{world.instance.pk}/stop/", {}),
        (f"/api/v1/instances/{world.instance.pk}/extend/", {"hours": 1}),
        ("/api/v1/billing/topups/", {"amount_usd": "25.00", "success_url": "https://e.com/a",
                                     "cancel_url": "https://e.com/b"}),
        ("/api/v1/ssh-keys/", {"name": "x", "public_key": public_key()}),
        ("/api/v1/api-keys/", {"name": "x", "access": "write"}),
        ("/api/v1/team/invitations/", {"email": "x@example.com"}),
    ]  # fmt: skip
    before = (Instance.objects.count(), SshKey.objects.count(), ApiKey.objects.count(),
              TopUp.objects.count(), Invitation.objects.count(), Hold.objects.count())  # fmt: skip
    for url, body in writes:
        response = session.post(url, body, content_type="application/json")
        assert response.status_code == 403, (url, response.content)
        assert "you are viewer" in response.json()["error"]["message"]
    after = (Instance.objects.count(), SshKey.objects.count(), ApiKey.objects.count(),
             TopUp.objects.count(), Invitation.objects.count(), Hold.objects.count())  # fmt: skip
    assert after == before


# --- member, admin and owner through the API -------------------------------------------------


def patch_role(client, membership: Membership, role: str):
    return client.patch(
        f"/api/v1/team/members/{membership.pk}/", {"role": role}, content_type="application/json"
    )


def test_api_roles_only_an_owner_makes_or_removes_an_owner(client, team, owner, admin, teammate):
    owner_m = Membership.objects.get(team=team, user=owner)
    admin_m = Membership.objects.get(team=team, user=admin)
    mate_m = Membership.objects.get(team=team, user=teammate)

    as_member = client_for(client, teammate, team)
    response = patch_role(as_member, admin_m, "viewer")
    assert response.status_code == 403 and "admin role" in response.json()["error"]["message"]
    client.logout()

    as_admin = client_for(client, admin, team)
    assert patch_role(as_admin, mate_m, "viewer").status_code == 200
    mate_m.refresh_from_db()
    assert mate_m.role == Role.VIEWER
    response = patch_role(as_admin, mate_m, "owner")
    assert response.status_code == 403
    assert "Only an owner" in response.json()["error"]["message"]
    assert patch_role(as_admin, owner_m, "member").status_code == 403
    response = as_admin.delete(f"/api/v1/team/members/{owner_m.pk}/")
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "Only an owner can remove an owner."
    owner_m.refresh_from_db()
    mate_m.refresh_from_db()
    assert owner_m.role == Role.OWNER and mate_m.role == Role.VIEWER
    assert as_admin.delete(f"/api/v1/team/members/{mate_m.pk}/").status_code == 204
    assert not Membership.objects.filter(pk=mate_m.pk).exists()
    client.logout()

    as_owner = client_for(client, owner, team)
    assert patch_role(as_owner, admin_m, "owner").status_code == 200
    admin_m.refresh_from_db()
    assert admin_m.role == Role.OWNER
    # Now a second owner exists, so the first may step down.
    assert patch_role(as_owner, owner_m, "admin").status_code == 200


# --- one error format, even for what DRF never sees ------------------------------------------


@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def explode(request):
    raise RuntimeError("database password is hunter2")


def explode_outside_drf(request):
    raise RuntimeError("database password is hunter2")


urlpatterns = [
    path("api/v1/test-explode/", explode),
    path("api/v1/test-explode-plain/", explode_outside_drf),
    path("test-explode-page/", explode_outside_drf),
    *project_urls.urlpatterns,
]
handler400 = project_urls.handler400
handler403 = project_urls.handler403
handler404 = project_urls.handler404
handler500 = project_urls.handler500


@pytest.mark.urls("tests.marketplace.test_api_tenancy")
@pytest.mark.parametrize("url", ["/api/v1/test-explode/", "/api/v1/test-explode-plain/"])
def test_unexpected_api_errors_answer_json_without_the_traceback(url, caplog):
    response = Client(raise_request_exception=False).get(url)
    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"]["code"] == "server_error"
    assert set(body["error"]) == {"code", "message", "fields"}
    assert "hunter2" not in response.content.decode()
    assert "Traceback" not in response.content.decode()
    # The traceback goes to the log instead.
    assert any(r.exc_info and "hunter2" in str(r.exc_info[1]) for r in caplog.records)


@pytest.mark.urls("tests.marketplace.test_api_tenancy")
def test_console_errors_stay_html_pages():
    response = Client(raise_request_exception=False).get("/test-explode-page/")
    assert response.status_code == 500
    assert "text/html" in response["Content-Type"]
    assert Client().get("/no-such-page/")["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("url", ["/api/", "/api/v2/instances/", "/api/v1/instances/nope/"])
def test_unknown_api_urls_answer_the_json_404(url, owner):
    client = Client()
    client.force_login(owner)
    response = client.get(url)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_role_change_without_a_role_answers_400_naming_it(client, team, owner, teammate):
    """Found by the schema fuzzer: a PATCH is partial, and an empty one was a 500."""
    member = Membership.objects.get(team=team, user=teammate)
    client_for(client, owner, team)
    response = client.patch(
        f"/api/v1/team/members/{member.pk}/", {}, content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"role": ["Give the member's new role."]}
    member.refresh_from_db()
    assert member.role == Role.MEMBER
