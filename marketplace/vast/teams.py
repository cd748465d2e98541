"""``vastai create team``, ``show members``, ``invite member``, ``remove member``, the team-role
commands, and ``transfer credit``, over our teams, memberships, invitations and billing's
ledger (marketplace/services/accounts.py, billing/credits.py).

A call acts as the key's creator in the key's team, with that person's role there (as the API
key commands do). Roles here are four fixed ones (owner, admin, member, viewer; each includes
the ones below), so ``show team-role(s)`` lists them and ``create/update/remove team-role`` are
refused naming them. ``transfer credit`` sends the key's team's available credit to another
team of the same person: the recipient is a team id (vast.ai's is an account's email or id;
an account here acts through its teams).
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from billing.credits import credit_transfer
from billing.money import MICRO_PER_DOLLAR, format_usd
from marketplace.models import ApiKey, Membership, Role, Team
from marketplace.services.accounts import (
    invitation_create,
    membership_remove,
    require_role,
    team_create,
)
from marketplace.vast.errors import Refused
from marketplace.vast.keys import KeysView
from marketplace.vast.views import ANY_JSON

# The most one transfer may send: a typo's extra zeros are refused, not sent.
MAX_TRANSFER_DOLLARS = 100_000
ROLE_PERMISSIONS = {
    Role.VIEWER: "reads the team's instances, machines, volumes, billing and members",
    Role.MEMBER: "a viewer who also rents, runs and lists machines and manages volumes",
    Role.ADMIN: "a member who also manages API keys, members and invitations, and sends credit",
    Role.OWNER: "an admin who also manages owners; a team keeps at least one",
}
FIXED_ROLES = (
    "Roles here are fixed: owner, admin, member and viewer (each includes the ones after it); "
    "invite a member with one of them."
)


def role_row(role: Role) -> dict[str, Any]:
    order = [Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OWNER]
    return {
        "id": order.index(role) + 1,
        "name": role.value,
        "permissions": {"includes": [r.value for r in order[: order.index(role)]]},
        "description": ROLE_PERMISSIONS[role],
    }


def role_named(name: Any) -> Role:
    if isinstance(name, str) and name.strip().lower() in Role.values:
        return Role(name.strip().lower())
    raise Refused(f"Unknown role {str(name)[:40]!r}. {FIXED_ROLES}", field="role")


def member_row(membership: Membership) -> dict[str, Any]:
    return {
        "id": membership.user_id,  # what remove member takes
        "membership_id": membership.pk,
        "username": membership.user.username,
        "email": membership.user.email,
        "role": membership.role,
        "created_at": membership.created_at.timestamp(),
    }


class TeamView(KeysView):
    """Acts as the key's creator in the key's team (KeysView.acting_membership)."""

    required_role = Role.MEMBER


class Teams(TeamView):
    """``create team`` (POST): a new team, its owner the key's creator; ``--transfer-credit``
    sends it that much of the key's team's credit in the same transaction. ``destroy team``
    (DELETE) is refused."""

    @extend_schema(
        summary="vast.ai: create team",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request):
        body = self.body()
        name = body.get("team_name")
        if not isinstance(name, str) or not name.strip():
            raise Refused("--team-name is the new team's name.", field="team_name")
        credit = body.get("transfer_credit") or 0
        membership = self.acting_membership()
        with transaction.atomic():
            try:
                team = team_create(name=name, owner=membership.user)
            except ValidationError as error:
                raise Refused(" ".join(error.messages), field="team_name") from None
            sent = ""
            if credit:
                amount = micro_dollars(credit, "transfer_credit")
                send_credit(self, membership, team, amount, f"new-team:{team.pk}")
                sent = f" and sent it {format_usd(amount)}"
        return Response(
            {
                "success": True,
                "team_id": team.pk,
                "team_name": team.name,
                "msg": f"Team {team.name} (id {team.pk}) created; you are its owner{sent}. "
                "This key keeps acting for its own team: make a key in the new team to act "
                "there.",
            }
        )

    @extend_schema(summary="vast.ai: destroy team", responses={400: ANY_JSON})
    def delete(self, request):
        raise Refused(
            "destroy team is not offered: a team keeps its ledger and rental history. Remove "
            "its members (remove member) and revoke its keys (delete api-key) instead.",
            field="team",
        )


class Members(TeamView):
    """``show members``."""

    @extend_schema(summary="vast.ai: show members", responses={200: ANY_JSON})
    def get(self, request):
        members = Membership.objects.filter(team=self.team).select_related("user")
        return Response([member_row(m) for m in members.order_by("created_at", "pk")])


class Member(TeamView):
    """``remove member <user id>``: admins remove others (owners only by an owner); a member
    may leave (the service's checks)."""

    @extend_schema(summary="vast.ai: remove member", responses={200: ANY_JSON})
    def delete(self, request, user_id: int):
        target = Membership.objects.filter(team=self.team, user_id=user_id).first()
        if target is None:
            raise NotFound(f"User {user_id} is not a member of your team.")
        membership_remove(actor=self.acting_membership(), target=target)
        return Response({"success": True, "msg": f"User {user_id} left the team."})


class Invite(TeamView):
    """``invite member --email E --role R``: an invitation link for that email, with one of
    our roles (admins; an owner only by an owner). The link is in ``invite_url`` (the CLI
    prints only that the invitation was made; the console's team page lists it)."""

    required_role = Role.ADMIN

    @extend_schema(
        summary="vast.ai: invite member",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request):
        email = request.query_params.get("email", "")
        try:
            validate_email(email)
        except ValidationError:
            raise Refused("--email is the invitee's email address.", field="email") from None
        role = role_named(request.query_params.get("role") or Role.MEMBER.value)
        try:
            issued = invitation_create(membership=self.acting_membership(), email=email, role=role)
        except ValidationError as error:
            raise Refused(" ".join(error.messages), field="email") from None
        link = request.build_absolute_uri(f"/invitations/{issued.token}/")
        return Response(
            {
                "success": True,
                "msg": f"Invitation created. Send this link to {email}: {link}",
                "invite_url": link,
                "role": role.value,
            }
        )


class Roles(TeamView):
    """``show team-roles`` (GET roles-full) and ``create team-role`` (POST, refused)."""

    @extend_schema(summary="vast.ai: show team-roles", responses={200: ANY_JSON})
    def get(self, request):
        return Response(
            [role_row(role) for role in (Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER)]
        )

    @extend_schema(
        summary="vast.ai: create team-role",
        request={"application/json": ANY_JSON},
        responses={400: ANY_JSON},
    )
    def post(self, request):
        raise Refused(f"create team-role is not offered. {FIXED_ROLES}", field="name")


class RoleDetail(TeamView):
    """``show team-role NAME``; ``update team-role ID`` and ``remove team-role NAME`` are
    refused (the roles are fixed)."""

    @staticmethod
    def role(name: str) -> Role:
        """A role by its name, or by its id in ``show team-roles`` (update team-role's)."""
        by_id = {str(row["id"]): row["name"] for row in map(role_row, Role)}
        found = by_id.get(name, name.lower())
        if found not in Role.values:
            raise NotFound(f"There is no role {name[:40]!r}. {FIXED_ROLES}")
        return Role(found)

    @extend_schema(summary="vast.ai: show team-role", responses={200: ANY_JSON})
    def get(self, request, name: str):
        return Response(role_row(self.role(name)))

    @extend_schema(
        summary="vast.ai: update team-role",
        request={"application/json": ANY_JSON},
        responses={400: ANY_JSON},
    )
    def put(self, request, name: str):
        self.role(name)
        raise Refused(f"update team-role is not offered. {FIXED_ROLES}", field="name")

    @extend_schema(summary="vast.ai: remove team-role", responses={400: ANY_JSON})
    def delete(self, request, name: str):
        self.role(name)
        raise Refused(f"remove team-role is not offered. {FIXED_ROLES}", field="name")


# --- transfer credit -------------------------------------------------------------------------


def micro_dollars(value: Any, field: str) -> int:
    """A positive number of dollars up to MAX_TRANSFER_DOLLARS → micro-dollars."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 < value <= MAX_TRANSFER_DOLLARS
    ):
        raise Refused(
            f"{field} is a number of dollars above 0 and at most {MAX_TRANSFER_DOLLARS}.",
            field=field,
        )
    amount = round(value * MICRO_PER_DOLLAR)
    if amount < 1:
        raise Refused(f"{field} is at least $0.000001.", field=field)
    return amount


def idempotency_key(view: KeysView, recipient_id: int, amount: int, salt: str = "") -> str:
    """The request's ``Idempotency-Key`` header; without one (the CLI sends none, and resends
    after a timeout), the same transfer by the same key within the same minute is taken as
    one: a second identical transfer goes through a minute later."""
    given = view.request.headers.get("Idempotency-Key", "")
    if given:
        return f"header:{given[:100]}"
    if salt:
        return salt
    caller = view.request.auth.pk if isinstance(view.request.auth, ApiKey) else "session"
    who = f"{caller}:{view.request.user.pk}:{recipient_id}:{amount}:{int(time.time() // 60)}"
    return "minute:" + hashlib.sha256(who.encode()).hexdigest()[:40]


def send_credit(view, membership: Membership, recipient: Team, amount: int, salt: str = ""):
    """The key's team sends ``amount`` to ``recipient``: an admin of the sending team, to a
    team the same person belongs to."""
    require_role(membership, Role.ADMIN)
    return credit_transfer(
        from_team_id=membership.team_id,
        to_team_id=recipient.pk,
        amount=amount,
        idempotency_key=idempotency_key(view, recipient.pk, amount, salt),
        created_by_id=membership.user_id,
    )


class TransferCredit(TeamView):
    """``transfer credit <team id> <dollars>``."""

    required_role = Role.ADMIN

    @extend_schema(
        summary="vast.ai: transfer credit",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request):
        body = self.body()
        if body.get("sender", "me") != "me":
            raise Refused('sender is "me": the key\'s own team sends.', field="sender")
        amount = micro_dollars(body.get("amount"), "amount")
        recipient_id = body.get("recipient")
        if isinstance(recipient_id, str) and recipient_id.isdigit() and len(recipient_id) < 19:
            recipient_id = int(recipient_id)
        if (
            not isinstance(recipient_id, int)
            or isinstance(recipient_id, bool)
            or not 1 <= recipient_id < 2**63
        ):
            raise Refused("The recipient is one of your teams' ids.", field="recipient")
        membership = self.acting_membership()
        recipient = Team.objects.filter(
            pk=recipient_id, memberships__user_id=membership.user_id
        ).first()
        if recipient is None:
            raise NotFound(f"Team {recipient_id} is not one of your teams.")
        transfer = send_credit(self, membership, recipient, amount)
        return Response(
            {
                "success": True,
                "msg": f"Sent {format_usd(amount)} to team {recipient.name} (id {recipient.pk}).",
                "transfer_id": transfer.pk,
            }
        )
