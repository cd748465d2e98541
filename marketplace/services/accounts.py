"""Writes for accounts: sign-up, teams, members, invitations, API keys."""

from __future__ import annotations

import functools
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from core.db import prepared_cursor
from hosts.user_text import name_check
from marketplace.models import ApiKey, Invitation, Membership, Role, Team, User
from marketplace.signals import access_lost

INVITATION_LIFETIME = timedelta(days=7)
API_KEY_PREFIX = "gpk"


@transaction.atomic
def user_sign_up(*, username: str, email: str, password: str) -> User:
    """A new user always gets a personal team that they own."""
    if User.objects.filter(email__iexact=email).exists():
        raise ValidationError({"email": "An account with this email already exists."})
    user = User.objects.create_user(username=username, email=email.lower(), password=password)
    personal_team_ensure(user=user)  # the user_created receiver made it already; this is a no-op
    return user


@transaction.atomic
def personal_team_ensure(*, user: User) -> Team:
    """Every user owns exactly one personal team, however the user was made (sign-up,
    ``createsuperuser``, the admin, a factory). Safe to call again: the user's row is locked, so
    two first requests at once still make one team."""
    User.objects.select_for_update().filter(pk=user.pk).first()
    found = (
        Membership.objects.select_related("team")
        .filter(user=user, team__personal=True)
        .order_by("created_at")
        .first()
    )
    if found is not None:
        return found.team
    team = Team.objects.create(name=f"{user.username}'s team"[:80], personal=True)
    Membership.objects.create(team=team, user=user, role=Role.OWNER)
    return team


@transaction.atomic
def team_create(*, name: str, owner: User) -> Team:
    name = name.strip()
    if not name:
        raise ValidationError({"name": "A team needs a name."})
    name_check(name, "name", max_length=80)
    team = Team.objects.create(name=name[:80])
    Membership.objects.create(team=team, user=owner, role=Role.OWNER)
    return team


def require_role(membership: Membership | None, needed: Role) -> None:
    if membership is None or not membership.allows(needed):
        raise PermissionDenied(f"This needs the {needed.label.lower()} role in the team.")


@dataclass(frozen=True)
class IssuedInvitation:
    invitation: Invitation
    token: str  # shown once, in the invitation link


@transaction.atomic
def invitation_create(
    *, membership: Membership, email: str, role: Role = Role.MEMBER
) -> IssuedInvitation:
    require_role(membership, Role.ADMIN)
    if role == Role.OWNER and not membership.allows(Role.OWNER):
        raise PermissionDenied("Only an owner can invite another owner.")
    team = membership.team
    if team.memberships.filter(user__email__iexact=email).exists():
        raise ValidationError({"email": "This person is already a member of the team."})
    token = secrets.token_urlsafe(24)
    invitation = Invitation.objects.create(
        team=team,
        email=email.lower(),
        role=role,
        token_hash=ApiKey.hash_secret(token),
        invited_by=membership.user,
        expires_at=timezone.now() + INVITATION_LIFETIME,
    )
    return IssuedInvitation(invitation=invitation, token=token)


@transaction.atomic
def invitation_accept(*, token: str, user: User) -> Membership:
    """Accepting is claimed with a conditional update, so a token is used once."""
    invitation = (
        Invitation.objects.select_for_update().filter(token_hash=ApiKey.hash_secret(token)).first()
    )
    if invitation is None or not invitation.is_open:
        raise ValidationError({"token": "This invitation is not valid any more."})
    if invitation.email.lower() != user.email.lower():
        raise ValidationError({"token": "This invitation was sent to another email address."})
    invitation.accepted_at = timezone.now()
    invitation.save(update_fields=["accepted_at"])
    membership, _ = Membership.objects.get_or_create(
        team=invitation.team, user=user, defaults={"role": invitation.role}
    )
    return membership


@transaction.atomic
def invitation_revoke(*, membership: Membership, invitation: Invitation) -> Invitation:
    """An admin withdraws an invitation; its link stops working. Revoking an invitation that
    was accepted or revoked already changes nothing (conditional update)."""
    require_role(membership, Role.ADMIN)
    if invitation.team_id != membership.team_id:
        raise PermissionDenied("Not this team's invitation.")
    Invitation.objects.filter(pk=invitation.pk, accepted_at=None, revoked_at=None).update(
        revoked_at=timezone.now()
    )
    invitation.refresh_from_db()
    return invitation


@transaction.atomic
def membership_set_role(*, actor: Membership, target: Membership, role: Role) -> Membership:
    require_role(actor, Role.ADMIN)
    if actor.team_id != target.team_id:
        raise PermissionDenied("Not a member of this team.")
    if Role.OWNER in (role, target.role) and not actor.allows(Role.OWNER):
        raise PermissionDenied("Only an owner can change an owner or make one.")
    if target.role == Role.OWNER and role != Role.OWNER:
        _ensure_another_owner(target)
    target.role = role
    target.save(update_fields=["role"])
    return target


@transaction.atomic
def membership_remove(*, actor: Membership, target: Membership) -> None:
    if actor.pk != target.pk:
        require_role(actor, Role.ADMIN)
        if target.role == Role.OWNER and not actor.allows(Role.OWNER):
            raise PermissionDenied("Only an owner can remove an owner.")
    if actor.team_id != target.team_id:
        raise PermissionDenied("Not a member of this team.")
    if target.team.personal:
        raise ValidationError({"team": "Nobody can leave a personal team."})
    if target.role == Role.OWNER:
        _ensure_another_owner(target)
    target.delete()
    _gateway_keys_changed()


def _gateway_keys_changed() -> None:
    """The cluster gateway drops keys that no longer pass from what it lets through by itself
    while the web processes are down (marketplace/clusters/remembered.py): on commit, told
    by a signal (the clusters app builds on accounts)."""
    access_lost.send(sender=Membership)


def _ensure_another_owner(target: Membership) -> None:
    owners = (
        Membership.objects.select_for_update()
        .filter(team_id=target.team_id, role=Role.OWNER)
        .exclude(pk=target.pk)
    )
    if not owners.exists():
        raise ValidationError({"role": "A team must keep at least one owner."})


@dataclass(frozen=True)
class IssuedApiKey:
    api_key: ApiKey
    secret: str  # the full key; shown once and never stored


def api_key_create(
    *,
    membership: Membership,
    name: str,
    access: str = ApiKey.Access.READ,
    audience: str = ApiKey.Audience.RENTER,
    expires_at: datetime | None = None,
) -> IssuedApiKey:
    require_role(membership, Role.ADMIN)
    name = name.strip()
    if not name:
        raise ValidationError({"name": "Give the key a name, so you can tell keys apart."})
    name_check(name, "name", max_length=80)
    if access not in ApiKey.Access.values:
        raise ValidationError({"access": f"Must be one of {', '.join(ApiKey.Access.values)}."})
    if audience not in ApiKey.Audience.values:
        raise ValidationError({"audience": f"Must be one of {', '.join(ApiKey.Audience.values)}."})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "The expiry must be in the future."})
    prefix = secrets.token_hex(4)
    secret = secrets.token_urlsafe(32)
    full_key = f"{API_KEY_PREFIX}_{prefix}_{secret}"
    api_key = ApiKey.objects.create(
        team=membership.team,
        name=name[:80],
        prefix=prefix,
        key_hash=ApiKey.hash_secret(full_key),
        access=access,
        audience=audience,
        created_by=membership.user,
        expires_at=expires_at,
    )
    return IssuedApiKey(api_key=api_key, secret=full_key)


def api_key_revoke(*, membership: Membership, api_key: ApiKey) -> ApiKey:
    require_role(membership, Role.ADMIN)
    if api_key.team_id != membership.team_id:
        raise PermissionDenied("Not this team's key.")
    # Conditional update: revoking twice keeps the first revocation time.
    ApiKey.objects.filter(pk=api_key.pk, revoked_at=None).update(revoked_at=timezone.now())
    api_key.refresh_from_db()
    _gateway_keys_changed()
    return api_key


def api_keys_with_creator_role(keys: QuerySet[ApiKey]) -> QuerySet[ApiKey]:
    """Keys annotated with ``creator_role``: their creator's role in the key's team right now
    (None when the creator left it, or their account is gone or disabled)."""
    creator_role = Membership.objects.filter(
        team_id=OuterRef("team_id"), user_id=OuterRef("created_by_id"), user__is_active=True
    ).values("role")[:1]
    return keys.select_related("team", "created_by").annotate(creator_role=Subquery(creator_role))


@functools.cache
def api_key_lookup_sql(related: bool) -> str:
    """``api_keys_with_creator_role`` for one prefix, written out once: composing and compiling
    that queryset took most of an API request's authentication, every request. Without
    ``related``, the key's own columns only (no team, no creator). Its one parameter is the
    prefix (``api_key_prefix``); ``api_key_from_row`` reads its row."""
    quote = connection.ops.quote_name

    def columns(model, alias: str) -> str:
        return ", ".join(f"{alias}.{quote(f.column)}" for f in model._meta.concrete_fields)

    membership, user = Membership._meta.db_table, User._meta.db_table
    related_columns = f"{columns(Team, 't')}, {columns(User, 'u')}," if related else ""
    related_joins = (
        f"""JOIN {quote(Team._meta.db_table)} t ON t.id = k.team_id
        LEFT JOIN {quote(user)} u ON u.id = k.created_by_id"""
        if related
        else ""
    )
    return f"""
        SELECT {columns(ApiKey, "k")}, {related_columns}
               (SELECT m.role FROM {quote(membership)} m JOIN {quote(user)} mu ON mu.id = m.user_id
                WHERE m.team_id = k.team_id AND m.user_id = k.created_by_id AND mu.is_active
                LIMIT 1)
        FROM {quote(ApiKey._meta.db_table)} k
        {related_joins}
        WHERE k.prefix = %s
    """  # noqa: S608  (table and column names from the models; the prefix is a parameter)


def _from_row(model, values: list):
    """A model instance from its concrete fields' raw column values, converted as the ORM
    converts them (SQLite's dates and booleans, for one)."""
    converted = list(values)
    for place, col, converters in _converters(model, connection.vendor):
        for convert in converters:
            converted[place] = convert(converted[place], col, connection)
    return model.from_db(connection.alias, None, converted)


@functools.cache
def _converters(model, vendor: str) -> tuple:
    """(place, column, converters) for each of the model's concrete fields that the database
    ``vendor``'s values need converted (on PostgreSQL, none of an API key's, team's or user's):
    worked out once, where asking each field on every API request cost a tenth of its
    authentication."""
    found = []
    for place, field in enumerate(model._meta.concrete_fields):
        col = field.get_col(model._meta.db_table)
        converters = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if converters:
            found.append((place, col, tuple(converters)))
    return tuple(found)


def api_key_from_row(row, related: bool) -> ApiKey:
    """The key (annotated with ``creator_role``) from a row of ``api_key_lookup_sql``."""
    keys, teams = len(ApiKey._meta.concrete_fields), len(Team._meta.concrete_fields)
    api_key = _from_row(ApiKey, row[:keys])
    api_key.creator_role = row[-1]
    if not related:
        return api_key
    ApiKey.team.field.set_cached_value(api_key, _from_row(Team, row[keys : keys + teams]))
    creator = row[keys + teams : -1]
    ApiKey.created_by.field.set_cached_value(
        api_key, None if creator[0] is None else _from_row(User, creator)
    )
    return api_key


def _api_key_by_prefix(prefix: str, related: bool = True) -> ApiKey | None:
    """The key with this prefix, its team and creator loaded (with ``related``), annotated
    with ``creator_role`` as ``api_keys_with_creator_role`` does."""
    # Planning the lookup's joins took three times as long as running them: prepared.
    with prepared_cursor() as cursor:
        cursor.execute(api_key_lookup_sql(related), [prefix])
        row = cursor.fetchone()
    return None if row is None else api_key_from_row(row, related)


def api_key_prefix(full_key: str) -> str | None:
    """The prefix of ``gpk_<prefix>_<secret>`` (what a key is looked up by), or None when the
    text is not shaped as a key."""
    parts = full_key.split("_", 2)
    if len(parts) != 3 or parts[0] != API_KEY_PREFIX:
        return None
    return parts[1]


def api_key_accepts(api_key: ApiKey, full_key: str) -> bool:
    """Whether ``full_key`` is this key's secret and the key is active."""
    return hmac.compare_digest(api_key.key_hash, ApiKey.hash_secret(full_key)) and api_key.is_active


def api_key_use_due(api_key: ApiKey, now: datetime) -> bool:
    """Whether to write ``last_used_at`` now: writing it on every request would make each API
    call a write; once a minute is enough to answer "is this key still in use?"."""
    return api_key.last_used_at is None or now - api_key.last_used_at > timedelta(minutes=1)


def api_key_authenticate(full_key: str, *, related: bool = True) -> ApiKey | None:
    """The key for ``gpk_<prefix>_<secret>``, if it exists, matches and is active.

    The key comes with ``creator_role``: its creator's role in the key's team right now (None
    when they left it or their account is gone or disabled); see ``ApiKey.acting_role``. With
    ``related``, its team and creator come loaded (an API request acts as them); the gateway,
    which only asks whether the key passes, reads the key alone.
    """
    prefix = api_key_prefix(full_key)
    api_key = None if prefix is None else _api_key_by_prefix(prefix, related)
    if api_key is None or not api_key_accepts(api_key, full_key):
        return None
    now = timezone.now()
    if api_key_use_due(api_key, now):
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
    return api_key


def invitations_expire() -> int:
    """Drop invitations that expired more than a week ago; returns how many."""
    cutoff = timezone.now() - timedelta(days=7)
    deleted, _ = Invitation.objects.filter(accepted_at=None, expires_at__lt=cutoff).delete()
    return deleted
