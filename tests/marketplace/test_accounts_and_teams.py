"""Sign-up, log in/out, teams, members and invitations, with an owner, a teammate and an outsider."""

from __future__ import annotations

import pytest
from django.urls import reverse

from marketplace.models import ApiKey, Invitation, Membership, Role, Team, User
from marketplace.services.tenancy import api_key_create, invitation_create
from tests.conftest import PASSWORD, client_for

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
    assert "at least one owner" in response.content.decode()
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
