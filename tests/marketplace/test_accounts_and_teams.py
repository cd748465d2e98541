"""Sign-up, log in/out, teams, members and invitations, with an owner, a teammate and an outsider."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from billing.models import Entry, TopUp
from marketplace.models import ApiKey, Invitation, Membership, Role, SshKey, Team, User
from marketplace.services.accounts import api_key_create, invitation_create, user_sign_up
from scheduler.models import Instance
from tests.conftest import PASSWORD, client_for
from tests.factories import UserFactory, add_member
from tests.marketplace.test_console_actions import page_messages
from tests.marketplace.test_tenancy_matrix import World, build_world, public_key

pytestmark = pytest.mark.django_db


def test_signup_creates_user_with_personal_team_and_logs_in(client):
    response = client.post(
        reverse("signup"),
        {
            "username": "newbie",
            "email": "NewBie@Example.com",
            "password1": "a-Long-pass-42",
            "password2": "a-Long-pass-42",
        },
    )
    assert response.status_code == 302
    user = User.objects.get(username="newbie")
    assert user.email == "newbie@example.com"
    membership = Membership.objects.get(user=user)
    assert membership.team.personal and membership.role == Role.OWNER
    assert client.get(reverse("console-home")).status_code == 200


def test_signup_with_taken_email_names_the_field_and_writes_nothing(client, owner):
    before = User.objects.count()
    response = client.post(
        reverse("signup"),
        {
            "username": "other",
            "email": owner.email.upper(),
            "password1": "a-Long-pass-42",
            "password2": "a-Long-pass-42",
        },
    )
    assert response.status_code == 200
    assert "already exists" in response.content.decode()
    assert User.objects.count() == before
    assert Team.objects.filter(name="other's team").count() == 0


def test_login_and_logout(client, owner):
    response = client.post(reverse("login"), {"username": "owner", "password": PASSWORD})
    assert response.status_code == 302
    assert client.get(reverse("console-home")).status_code == 200
    client.post(reverse("logout"))
    response = client.get(reverse("console-home"))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_console_pages_need_login(client):
    for name in ["console-home", "team-settings", "api-keys"]:
        response = client.get(reverse(name))
        assert response.status_code == 302, name


def test_team_page_lists_members_to_teammate_but_not_outsider(
    client, team, owner, teammate, outsider
):
    page = client_for(client, teammate, team).get(reverse("team-settings")).content.decode()
    assert "owner" in page and "teammate" in page
    client.logout()
    page = client_for(client, outsider).get(reverse("team-settings")).content.decode()
    assert "teammate" not in page and "Acme GPUs" not in page


def test_switching_to_a_team_you_are_not_in_is_refused(client, team, outsider):
    client_for(client, outsider)
    client.post(reverse("team-switch"), {"team": team.id})
    assert client.session.get("active_team_id") != team.id
    page = client.get(reverse("team-settings")).content.decode()
    assert "Acme GPUs" not in page


def test_outsider_cannot_touch_another_teams_member_or_key(client, team, owner, teammate, outsider):
    target = Membership.objects.get(team=team, user=teammate)
    key = api_key_create(
        membership=Membership.objects.get(team=team, user=owner), name="ci"
    ).api_key
    client_for(client, outsider)
    assert (
        client.post(reverse("member-update", args=[target.pk]), {"role": "viewer"}).status_code
        == 404
    )
    assert client.post(reverse("api-key-revoke", args=[key.pk])).status_code == 404
    target.refresh_from_db()
    key.refresh_from_db()
    assert target.role == Role.MEMBER and key.revoked_at is None


def test_member_cannot_change_roles_but_admin_can(client, team, owner, teammate):
    target = Membership.objects.get(team=team, user=owner)
    client_for(client, teammate, team)
    client.post(reverse("member-update", args=[target.pk]), {"role": "viewer"})
    target.refresh_from_db()
    assert target.role == Role.OWNER
    client.logout()
    mate = Membership.objects.get(team=team, user=teammate)
    client_for(client, owner, team).post(
        reverse("member-update", args=[mate.pk]), {"role": "admin"}
    )
    mate.refresh_from_db()
    assert mate.role == Role.ADMIN


def test_last_owner_cannot_step_down(client, team, owner):
    me = Membership.objects.get(team=team, user=owner)
    response = client_for(client, owner, team).post(
        reverse("member-update", args=[me.pk]), {"role": "member"}, follow=True
    )
    # Every console page words a refusal the same way: the field, then the reason.
    assert page_messages(response) == ["role: A team must keep at least one owner."]
    me.refresh_from_db()
    assert me.role == Role.OWNER


def test_invitation_link_adds_the_invited_user_once(client, team, owner, outsider):
    issued = invitation_create(
        membership=Membership.objects.get(team=team, user=owner),
        email=outsider.email,
        role=Role.VIEWER,
    )
    client_for(client, outsider)
    url = reverse("invitation-accept", args=[issued.token])
    assert "Join Acme GPUs" in client.get(url).content.decode()
    client.post(url)
    assert Membership.objects.get(team=team, user=outsider).role == Role.VIEWER
    client.post(url)  # a second use changes nothing
    assert Membership.objects.filter(team=team, user=outsider).count() == 1
    assert Invitation.objects.get(pk=issued.invitation.pk).accepted_at is not None


def test_invitation_for_another_email_is_refused(client, team, owner, outsider, teammate):
    issued = invitation_create(
        membership=Membership.objects.get(team=team, user=owner), email="someone@else.io"
    )
    client_for(client, outsider).post(reverse("invitation-accept", args=[issued.token]))
    assert not Membership.objects.filter(team=team, user=outsider).exists()


def test_api_key_page_shows_secret_once_and_stores_only_hash(client, team, owner):
    client_for(client, owner, team)
    response = client.post(
        reverse("api-keys"), {"name": "deploy bot", "access": "write", "audience": "renter"}
    )
    page = response.content.decode()
    key = ApiKey.objects.get(team=team, name="deploy bot")
    start = page.index("gpk_" + key.prefix + "_")
    secret = page[start : page.index("<", start)]
    assert key.key_hash == ApiKey.hash_secret(secret)
    assert secret not in str(ApiKey.objects.filter(pk=key.pk).values().get())
    assert secret not in client.get(reverse("api-keys")).content.decode()


# --- every user has a personal team, however the account was made ---------------------------


def personal_teams(user) -> list[Membership]:
    return list(Membership.objects.filter(user=user, team__personal=True))


def assert_console_works(client, user) -> None:
    client.force_login(user)
    for url in ["/", "/team/", "/instances/", "/team/api-keys/", "/billing/", "/machines/"]:
        assert client.get(url).status_code == 200, url


def test_create_user_gets_exactly_one_personal_team(client):
    user = User.objects.create_user("scripted", "scripted@example.com", "a-Long-pass-42")
    [membership] = personal_teams(user)
    assert membership.role == Role.OWNER and membership.team.name == "scripted's team"
    assert_console_works(client, user)


def test_signup_makes_one_personal_team_not_two(client):
    user = user_sign_up(username="solo", email="solo@example.com", password="a-Long-pass-42")
    assert len(personal_teams(user)) == 1


def test_createsuperuser_gets_a_personal_team(client, monkeypatch):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "a-Long-pass-42")
    call_command(
        "createsuperuser", interactive=False, username="root", email="root@example.com",
        stdout=StringIO(),
    )  # fmt: skip
    user = User.objects.get(username="root")
    assert len(personal_teams(user)) == 1
    assert_console_works(client, user)


def test_users_added_in_the_admin_get_personal_teams_and_a_working_console(client):
    operator = User.objects.create_superuser("op", "op@example.com", PASSWORD)
    client.force_login(operator)
    for name in ["alice", "bob"]:  # two: each needs an email of their own
        response = client.post(
            "/admin/marketplace/user/add/",
            {"username": name, "email": f"{name}@example.com", "usable_password": "true",
             "password1": "a-Long-pass-42", "password2": "a-Long-pass-42", "_save": "Save"},
        )  # fmt: skip
        assert response.status_code == 302, response.content.decode()[:2000]
    for name in ["alice", "bob"]:
        user = User.objects.get(username=name)
        assert len(personal_teams(user)) == 1
        client.logout()
        assert_console_works(client, user)


def test_admin_add_user_form_asks_for_the_email(client):
    operator = User.objects.create_superuser("op", "op@example.com", PASSWORD)
    client.force_login(operator)
    response = client.post(
        "/admin/marketplace/user/add/",
        {"username": "carol", "usable_password": "true", "password1": "a-Long-pass-42",
         "password2": "a-Long-pass-42", "_save": "Save"},
    )  # fmt: skip
    assert response.status_code == 200  # the form again, with the error
    assert "This field is required" in response.content.decode()
    assert not User.objects.filter(username="carol").exists()


def test_a_user_left_without_any_team_gets_one_on_the_next_request(client, outsider):
    Membership.objects.filter(user=outsider).delete()
    Team.objects.filter(memberships=None).delete()
    assert_console_works(client, outsider)
    assert len(personal_teams(outsider)) == 1


# --- roles in the console --------------------------------------------------------------------


@pytest.fixture
def viewer(team):
    user = UserFactory(username="viewer")
    add_member(team, user, Role.VIEWER)
    return user


@pytest.fixture
def admin(team):
    user = UserFactory(username="admin")
    add_member(team, user, Role.ADMIN)
    return user


@pytest.fixture
def rented(team, owner, viewer) -> World:
    return build_world(
        tag="acme", team=team, admin=Membership.objects.get(team=team, user=owner),
        member=Membership.objects.get(team=team, user=viewer), n=30, dollars=100,
    )  # fmt: skip


def counts() -> tuple[int, ...]:
    return (
        Instance.objects.count(), SshKey.objects.count(), ApiKey.objects.count(),
        TopUp.objects.count(), Entry.objects.count(), Invitation.objects.count(),
    )  # fmt: skip


def test_viewer_reads_console_pages(client, team, viewer, rented):
    client_for(client, viewer, team)
    for url in ["/", "/instances/", f"/instances/{rented.instance.pk}/", "/ssh-keys/",
                "/billing/", "/team/api-keys/", "/machines/", "/team/"]:  # fmt: skip
        assert client.get(url).status_code == 200, url


def test_viewer_cannot_rent_stop_exec_add_ssh_keys_or_create_api_keys(
    client, team, viewer, rented, django_capture_on_commit_callbacks
):
    client_for(client, viewer, team)
    before = counts()
    instance = rented.instance
    forbidden = [
        (f"/offers/{rented.machine.pk}/rent/",
         {"image": "busybox", "num_gpus": "1", "duration_hours": "1"}),
        (f"/instances/{instance.pk}/stop/", {}),
        (f"/instances/{instance.pk}/extend/", {"hours": "1"}),
        (f"/instances/{instance.pk}/destroy/", {}),
        (f"/instances/{instance.pk}/exec/", {"command": "id"}),
        ("/ssh-keys/", {"name": "laptop", "public_key": public_key()}),
        ("/ssh-keys/", {"delete": rented.ssh_key.pk}),
    ]  # fmt: skip
    with django_capture_on_commit_callbacks() as queued:
        for url, data in forbidden:
            assert client.post(url, data).status_code == 403, url
        page = client.post(
            "/team/api-keys/", {"name": "bot", "access": "write", "audience": "renter"}
        ).content.decode()
    assert "needs the admin role" in page
    assert queued == []
    assert counts() == before
    instance.refresh_from_db()
    assert instance.state == "launching"


def test_viewer_cannot_top_up_or_take_test_credit(client, team, viewer, rented, settings):
    settings.TEST_CREDIT_ENABLED = True
    settings.STRIPE_SECRET_KEY = "sk_test_not_used"
    client_for(client, viewer, team)
    before = counts()
    response = client.post("/billing/topup/", {"amount": "25.00"}, follow=True)
    assert "Viewers cannot top up" in response.content.decode()
    response = client.post("/billing/test-credit/", {"nonce": "n1"}, follow=True)
    assert "Viewers cannot add credit" in response.content.decode()
    assert counts() == before


def post_role(client, membership: Membership, role: str):
    return client.post(reverse("member-update", args=[membership.pk]), {"role": role}, follow=True)


def test_console_roles_only_an_owner_makes_or_removes_an_owner(
    client, team, owner, admin, teammate
):
    owner_m = Membership.objects.get(team=team, user=owner)
    admin_m = Membership.objects.get(team=team, user=admin)
    mate_m = Membership.objects.get(team=team, user=teammate)

    client_for(client, admin, team)
    post_role(client, mate_m, "viewer")
    mate_m.refresh_from_db()
    assert mate_m.role == Role.VIEWER
    page = post_role(client, mate_m, "owner").content.decode()
    assert "Only an owner" in page
    post_role(client, owner_m, "member")
    page = client.post(
        reverse("member-update", args=[owner_m.pk]), {"action": "remove"}, follow=True
    ).content.decode()
    assert "Only an owner can remove an owner." in page
    page = client.post(
        reverse("invitation-create"), {"email": "new@example.com", "role": "owner"}, follow=True
    ).content.decode()
    assert "Only an owner can invite another owner." in page
    owner_m.refresh_from_db()
    mate_m.refresh_from_db()
    assert owner_m.role == Role.OWNER and mate_m.role == Role.VIEWER
    assert not Invitation.objects.filter(team=team).exists()
    client.post(reverse("member-update", args=[mate_m.pk]), {"action": "remove"})
    assert not Membership.objects.filter(pk=mate_m.pk).exists()
    client.logout()

    client_for(client, owner, team)
    post_role(client, admin_m, "owner")
    admin_m.refresh_from_db()
    assert admin_m.role == Role.OWNER
    client.post(reverse("member-update", args=[admin_m.pk]), {"action": "remove"})
    assert not Membership.objects.filter(pk=admin_m.pk).exists()


# --- invitations in the console: revoke, expired ---------------------------------------------


def test_admin_revokes_an_invitation_in_the_console_and_its_link_dies(
    client, team, owner, teammate, outsider
):
    issued = invitation_create(
        membership=Membership.objects.get(team=team, user=owner), email=outsider.email
    )
    url = reverse("invitation-revoke", args=[issued.invitation.pk])
    client_for(client, teammate, team).post(url)  # a member may not
    assert Invitation.objects.get(pk=issued.invitation.pk).revoked_at is None
    client.logout()
    page = client_for(client, owner, team).post(url, follow=True).content.decode()
    assert "revoked" in page
    assert Invitation.objects.get(pk=issued.invitation.pk).revoked_at is not None
    assert outsider.email not in client.get(reverse("team-settings")).content.decode()
    client.logout()
    client_for(client, outsider).post(reverse("invitation-accept", args=[issued.token]))
    assert not Membership.objects.filter(team=team, user=outsider).exists()


def test_expired_invitations_show_as_expired_not_open(client, team, owner):
    membership = Membership.objects.get(team=team, user=owner)
    fresh = invitation_create(membership=membership, email="fresh@example.com").invitation
    stale = invitation_create(membership=membership, email="stale@example.com").invitation
    Invitation.objects.filter(pk=stale.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    page = client_for(client, owner, team).get(reverse("team-settings")).content.decode()
    rows = {inv.email: row_of(page, inv.email) for inv in (fresh, stale)}
    assert "open" in rows["fresh@example.com"] and "expired" not in rows["fresh@example.com"]
    assert "expired" in rows["stale@example.com"] and ">open<" not in rows["stale@example.com"]
    listed = client.get("/api/v1/team/invitations/").json()["results"]
    assert {i["email"]: i["status"] for i in listed} == {
        "fresh@example.com": "open",
        "stale@example.com": "expired",
    }


def row_of(page: str, text: str) -> str:
    start = page.rindex("<tr", 0, page.index(text))
    return page[start : page.index("</tr>", start)]


# --- switching teams -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "next_url",
    ["https://evil.example/phish", "//evil.example/phish", "http://testserver.evil.example/"],
)
def test_team_switch_never_redirects_off_site(client, team, owner, next_url):
    client_for(client, owner)
    response = client.post(reverse("team-switch"), {"team": team.pk, "next": next_url})
    assert response.status_code == 302
    assert response["Location"] == reverse("console-home")
    assert client.session["active_team_id"] == team.pk


def test_team_switch_returns_to_the_page_it_came_from(client, team, owner):
    client_for(client, owner)
    response = client.post(reverse("team-switch"), {"team": team.pk, "next": "/instances/"})
    assert response["Location"] == "/instances/"


@pytest.mark.parametrize("value", ["abc", "", "-1", "1e3", "99999999999999999999999", "1;2"])
def test_team_switch_to_a_team_that_is_not_a_number_is_refused_and_changes_nothing(
    client, team, owner, value
):
    client_for(client, owner, team)
    response = client.post(reverse("team-switch"), {"team": value}, follow=True)
    assert response.status_code == 200
    assert "You are not a member of that team." in response.content.decode()
    assert client.session["active_team_id"] == team.pk
