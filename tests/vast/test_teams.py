"""``vastai create team``, ``show members``, ``invite member``, ``remove member``, the team-role
commands and ``transfer credit``; the paths and bodies are the CLI 1.9.1's (vastai/api/teams.py).
"""

from __future__ import annotations

import json

import pytest

from billing.models import Transfer
from billing.selectors import team_balance
from marketplace.models import ApiKey, Invitation, Membership, Role, Team
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member

pytestmark = pytest.mark.django_db

TRANSFER = "/api/v0/commands/transfer_credit/"


def available(team) -> int:
    return team_balance(team.pk).available


def money_rows() -> tuple:
    return Transfer.objects.count(), Team.objects.count()


def test_create_team_makes_the_keys_creator_its_owner_and_sends_it_credit(funded_team, owner):
    client = key_client(funded_team)
    before = available(funded_team)
    made = client.post("/api/v0/team/", {"team_name": "Lab", "transfer_credit": 5}, format="json")
    assert made.status_code == 200 and made.json()["success"], made.content
    lab = Team.objects.get(pk=made.json()["team_id"])
    assert lab.name == "Lab"
    assert Membership.objects.get(team=lab).user == owner
    assert Membership.objects.get(team=lab).role == Role.OWNER
    assert available(lab) == 5_000_000 and available(funded_team) == before - 5_000_000

    rows = money_rows()
    for body in (
        {"team_name": "Rich", "transfer_credit": 1000},  # more than the team has
        {"team_name": "Neg", "transfer_credit": -5},
        {"team_name": "", "transfer_credit": 0},
        {"team_name": "x" * 81},
    ):
        refused = client.post("/api/v0/team/", body, format="json")
        assert refused.status_code in (400, 402), (body, refused.content)
        assert refused.json()["success"] is False
    assert money_rows() == rows and not Team.objects.filter(name__in=["Rich", "Neg"]).exists()
    gone = client.delete("/api/v0/team/")
    assert gone.status_code == 400 and "destroy team is not offered" in gone.json()["msg"]


def test_transfer_credit_moves_credit_once_between_the_callers_teams(funded_team, owner):
    lab = TeamFactory(name="Lab")
    add_member(lab, owner, Role.MEMBER)  # any role in the recipient team
    client = key_client(funded_team)
    before = available(funded_team)
    body = {"sender": "me", "recipient": str(lab.pk), "amount": 2.5}
    sent = client.put(TRANSFER, body, format="json", HTTP_IDEMPOTENCY_KEY="abc")
    assert sent.status_code == 200 and sent.json()["success"], sent.content
    again = client.put(TRANSFER, body, format="json", HTTP_IDEMPOTENCY_KEY="abc")
    assert again.status_code == 200 and again.json()["transfer_id"] == sent.json()["transfer_id"]
    assert available(lab) == 2_500_000 and available(funded_team) == before - 2_500_000
    # The CLI sends no key: the same transfer resent at once (its retry) moves nothing more.
    plain = {"sender": "me", "recipient": lab.pk, "amount": 1}
    first = client.put(TRANSFER, plain, format="json")
    second = client.put(TRANSFER, plain, format="json")
    assert first.json()["transfer_id"] == second.json()["transfer_id"]
    assert available(lab) == 3_500_000


def test_transfers_that_cannot_be_made_write_nothing(funded_team, owner):
    lab = TeamFactory(name="Lab")
    add_member(lab, owner, Role.OWNER)
    strangers = TeamFactory(name="Strangers")
    add_member(strangers, UserFactory(), Role.OWNER)
    client = key_client(funded_team)
    viewer = UserFactory()
    add_member(funded_team, viewer, Role.MEMBER)
    cases = [
        ({"recipient": lab.pk, "amount": -1}, 400, "amount"),
        ({"recipient": lab.pk, "amount": 0}, 400, "amount"),
        ({"recipient": lab.pk, "amount": 1e9}, 400, "amount"),
        (f'{{"recipient": {lab.pk}, "amount": 1e309}}', 400, "amount"),  # inf
        ({"recipient": lab.pk, "amount": "5"}, 400, "amount"),
        ({"recipient": lab.pk, "amount": True}, 400, "amount"),
        ({"recipient": lab.pk, "amount": 1e-9}, 400, "amount"),
        ({"recipient": lab.pk, "amount": 5000}, 402, None),  # more than it has
        ({"recipient": strangers.pk, "amount": 1}, 404, None),  # not one of the caller's
        ({"recipient": funded_team.pk, "amount": 1}, 400, "recipient"),  # itself
        ({"recipient": "lab", "amount": 1}, 400, "recipient"),
        ({"recipient": 2**63, "amount": 1}, 400, "recipient"),
        ({"recipient": [lab.pk], "amount": 1}, 400, "recipient"),
        ({"sender": "someone", "recipient": lab.pk, "amount": 1}, 400, "sender"),
    ]
    before = (Transfer.objects.count(), available(funded_team), available(lab))
    for body, status, field in cases:
        text = body if isinstance(body, str) else json.dumps(body)
        answer = client.put(TRANSFER, text, content_type="application/json")
        assert answer.status_code == status, (body, answer.content)
        assert answer.json()["success"] is False
        if field:
            assert field in answer.json()["error"]["fields"], (body, answer.json())
    read_only = key_client(funded_team, access=ApiKey.Access.READ)
    assert (
        read_only.put(TRANSFER, {"recipient": lab.pk, "amount": 1}, format="json").status_code
        == 403
    )
    member_key = api_key_of(funded_team, viewer)
    assert (
        member_key.put(TRANSFER, {"recipient": lab.pk, "amount": 1}, format="json").status_code
        == 403
    )
    assert (Transfer.objects.count(), available(funded_team), available(lab)) == before


def api_key_of(team, user):
    from rest_framework.test import APIClient

    from marketplace.services.accounts import api_key_create

    # An admin makes the key for the member (a key acts with its creator's role).
    admin = team.memberships.filter(role=Role.OWNER).first()
    issued = api_key_create(membership=admin, name="m", access=ApiKey.Access.WRITE,
                            audience=ApiKey.Audience.ALL)  # fmt: skip
    ApiKey.objects.filter(pk=issued.api_key.pk).update(created_by=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    return client


def test_members_invitations_and_roles(funded_team, owner):
    client = key_client(funded_team)
    shown = client.get("/api/v0/team/members/")
    assert [(m["id"], m["role"]) for m in shown.json()] == [(owner.pk, "owner")]

    invited = client.post("/api/v0/team/invite/?email=ann@example.com&role=admin")
    assert invited.status_code == 200 and "/invitations/" in invited.json()["invite_url"]
    invitation = Invitation.objects.get(team=funded_team)
    assert (invitation.email, invitation.role) == ("ann@example.com", Role.ADMIN)
    for query, field in (
        ("email=nope&role=member", "email"),
        ("email=b@example.com&role=chef", "role"),
    ):
        refused = client.post(f"/api/v0/team/invite/?{query}")
        assert refused.status_code == 400 and field in refused.json()["error"]["fields"]
    assert Invitation.objects.count() == 1

    bob = UserFactory()
    add_member(funded_team, bob, Role.MEMBER)
    stranger = UserFactory()
    add_member(TeamFactory(), stranger, Role.MEMBER)
    assert client.delete(f"/api/v0/team/members/{stranger.pk}/").status_code == 404
    removed = client.delete(f"/api/v0/team/members/{bob.pk}/")
    assert removed.status_code == 200 and removed.json()["success"], removed.content
    assert not Membership.objects.filter(team=funded_team, user=bob).exists()
    assert Membership.objects.filter(user=stranger).exists()

    roles = client.get("/api/v0/team/roles-full/").json()
    assert [r["name"] for r in roles] == ["owner", "admin", "member", "viewer"]
    assert client.get("/api/v0/team/roles/admin/").json()["name"] == "admin"
    assert client.get("/api/v0/team/roles/chef/").status_code == 404
    for method, path in (("post", "/api/v0/team/roles/"), ("put", "/api/v0/team/roles/3/"),
                         ("delete", "/api/v0/team/roles/member/")):  # fmt: skip
        refused = getattr(client, method)(path, {"name": "x", "permissions": {}}, format="json")
        assert refused.status_code == 400 and "Roles here are fixed" in refused.json()["msg"]
