"""``vastai show/create/delete api-key``: the team's API keys, scoped as ours; and
``show/create/update/delete env-var``: the team's environment variables.

Our keys have two scopes, access (read or write) and audience (renter, provider or both);
vast.ai's permission file names categories (``{"api": {"instance_read": {}, ...}}``). A
category's ``_write`` asks for write access; ``machine_*`` asks for the provider side,
``instance_*`` the renter side. Through this API a key makes keys no broader than itself, with
the same creator (so the new key acts with at most that person's role), and only for an
admin, as in the console; the secret is shown once, at creation.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.response import Response

from marketplace.models import ApiKey, Membership, Role, TeamEnvVar
from marketplace.services.accounts import api_key_create, api_key_revoke
from marketplace.services.env_vars import HIDDEN, env_var_create, env_var_delete, env_var_update
from marketplace.tenancy import team_objects
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, VastView

RENTER_SIDE = {"instance", "billing", "user", "misc", "team"}
PROVIDER_SIDE = {"machine", "billing", "user", "misc", "team"}
CATEGORIES = {
    f"{side}_{verb}" for side in RENTER_SIDE | PROVIDER_SIDE for verb in ("read", "write")
}
CATEGORIES |= {"misc"}


def our_scopes(permissions: Any) -> tuple[str, str]:
    """vast.ai's permissions → our (access, audience)."""
    if permissions in (None, {}):
        raise Refused(
            'Give a permission file, like {"api": {"instance_read": {}, "instance_write": {}}}.',
            field="permissions",
        )
    api = permissions.get("api") if isinstance(permissions, dict) else None
    if not isinstance(api, dict) or not api:
        raise Refused(
            'permissions is {"api": {"<category>": {}, ...}}, like {"api": {"instance_read": {}}}.',
            field="permissions",
        )
    unknown = sorted(set(api) - CATEGORIES)
    if unknown:
        raise Refused(
            f"Unknown permission {unknown[0]!r}: keys here have read or write access to the "
            "renter side (instance_*), the provider side (machine_*) or both.",
            field="permissions",
        )
    if any(constraint not in (None, {}) for constraint in api.values()):
        raise Refused(
            "Permission constraints are not supported: a key here covers all of its side.",
            field="permissions",
        )
    access = ApiKey.Access.WRITE if any(c.endswith("_write") for c in api) else ApiKey.Access.READ
    renter = any(c.startswith("instance_") for c in api)
    provider = any(c.startswith("machine_") for c in api)
    if provider and not renter:
        audience = ApiKey.Audience.PROVIDER
    elif renter and not provider:
        audience = ApiKey.Audience.RENTER
    else:
        audience = ApiKey.Audience.ALL
    return access, audience


def vast_permissions(key: ApiKey) -> dict[str, Any]:
    """Our key's scopes in vast.ai's words."""
    sides = {"instance"} if key.audience == ApiKey.Audience.RENTER else {"machine"}
    if key.audience == ApiKey.Audience.ALL:
        sides = {"instance", "machine"}
    sides |= {"user", "billing"}
    verbs = ("read", "write") if key.access == ApiKey.Access.WRITE else ("read",)
    return {"api": {f"{side}_{verb}": {} for side in sorted(sides) for verb in verbs}}


def key_row(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.pk,
        "name": key.name,
        "prefix": key.prefix,  # the secret is shown once, at creation
        "access": key.access,
        "audience": key.audience,
        "permissions": vast_permissions(key),
        "created_at": key.created_at.timestamp(),
        "expires_at": key.expires_at.timestamp() if key.expires_at else None,
        "revoked_at": key.revoked_at.timestamp() if key.revoked_at else None,
        "last_used_at": key.last_used_at.timestamp() if key.last_used_at else None,
    }


class KeysView(VastView):
    required_role = Role.ADMIN  # for changes, as the console's key page

    def acting_membership(self) -> Membership:
        """The membership the calling key acts for: its creator's in the key's team."""
        key = self.request.auth
        membership = None
        if isinstance(key, ApiKey):
            membership = Membership.objects.filter(team=key.team, user=key.created_by).first()
        else:
            membership = Membership.objects.filter(team=self.team, user=self.request.user).first()
        if membership is None:
            raise PermissionDenied("This key's creator is no longer in the team.")
        return membership

    def key(self, pk: int) -> ApiKey:
        found = team_objects(self.team, ApiKey.objects.all()).filter(pk=pk).first()
        if found is None:
            raise NotFound(f"API key {pk} is not one of your team's keys.")
        return found


class ApiKeys(KeysView):
    """``show api-keys`` (GET) and ``create api-key --name N --permission_file F`` (POST)."""

    @extend_schema(summary="vast.ai: show api-keys", responses={200: ANY_JSON})
    def get(self, request):
        keys = team_objects(self.team, ApiKey.objects.filter(revoked_at=None).order_by("pk"))
        return Response({"apikeys": [key_row(key) for key in keys]})

    @extend_schema(
        summary="vast.ai: create api-key",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request):
        body = self.body()
        if body.get("key_params"):
            raise Refused("--key_params is not supported: keys here have no wildcards.")
        access, audience = our_scopes(body.get("permissions"))
        caller = request.auth
        if isinstance(caller, ApiKey) and (
            (caller.access == ApiKey.Access.READ and access == ApiKey.Access.WRITE)
            or (caller.audience != ApiKey.Audience.ALL and audience != caller.audience)
        ):
            raise PermissionDenied(
                f"A key makes keys no broader than itself: this one is {caller.access} for "
                f"{caller.audience}."
            )
        name = body.get("name")
        issued = api_key_create(
            membership=self.acting_membership(),
            name=name if isinstance(name, str) else "",
            access=access,
            audience=audience,
        )
        return Response({"success": True, **key_row(issued.api_key), "key": issued.secret})


class ApiKeyDetail(KeysView):
    """``show api-key ID`` (GET) and ``delete api-key ID`` (DELETE: revoked at once)."""

    @extend_schema(summary="vast.ai: show api-key", responses={200: ANY_JSON})
    def get(self, request, pk: int):
        return Response(key_row(self.key(pk)))

    @extend_schema(summary="vast.ai: delete api-key", responses={200: ANY_JSON})
    def delete(self, request, pk: int):
        revoked = api_key_revoke(membership=self.acting_membership(), api_key=self.key(pk))
        return Response({"success": True, "msg": f"API key {revoked.name} revoked."})


# --- env-vars --------------------------------------------------------------------------------


class EnvVars(VastView):
    """``show env-vars`` (GET), ``create env-var NAME VALUE`` (POST), ``update env-var`` (PUT),
    ``delete env-var NAME`` (DELETE): the team's variables, which every new instance gets.
    A value is never shown back, with ``-s`` neither: the CLI prints ``*****``."""

    audience = "renter"

    @extend_schema(summary="vast.ai: show env-vars", responses={200: ANY_JSON})
    def get(self, request):
        variables = team_objects(self.team, TeamEnvVar.objects.all())
        return Response({"secrets": {v.name: HIDDEN for v in variables}})

    @extend_schema(
        summary="vast.ai: create env-var", request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )  # fmt: skip
    def post(self, request):
        name, value = self.name_and_value()
        env_var_create(team=self.team, name=name, value=value)
        return Response({"success": True, "msg": f"Environment variable {name} created."})

    @extend_schema(
        summary="vast.ai: update env-var", request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )  # fmt: skip
    def put(self, request):
        name, value = self.name_and_value()
        env_var_update(team=self.team, name=name, value=value)
        return Response(
            {"success": True, "msg": f"Environment variable {name} updated (for new instances)."}
        )

    @extend_schema(
        summary="vast.ai: delete env-var", request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )  # fmt: skip
    def delete(self, request):
        name = self.body().get("key")
        if not isinstance(name, str) or not name:
            raise Refused("key is the variable's name.", field="key")
        env_var_delete(team=self.team, name=name)
        return Response({"success": True, "msg": f"Environment variable {name} deleted."})

    def name_and_value(self) -> tuple[str, str]:
        body = self.body()
        name, value = body.get("key"), body.get("value")
        if not isinstance(name, str) or not name:
            raise Refused("key is the variable's name.", field="key")
        if not isinstance(value, str):
            raise Refused("value is text.", field="value")
        return name, value
