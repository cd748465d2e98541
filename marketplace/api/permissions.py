"""Who may do what through the API.

A request acts for one team, with one role in it:

- a session acts with the user's membership role in their active team;
- an API key acts with the lesser of its access (read-only → viewer) and its creator's current
  role in the team (``ApiKey.acting_role``): demoting the creator demotes the key, and a key
  whose creator left the team answers 401 saying so.

Reads need any role (viewer and up); writes need the member role, or more where a view sets
``required_role``. A view may ask for a side of the market (``audience``: "renter" or
"provider"), be ``session_only`` (managed in the console, never with a key), or declare that
some unsafe methods only read (``read_only_methods``, e.g. offer search by a POSTed body).
"""

from __future__ import annotations

from collections.abc import Callable

from rest_framework import exceptions, permissions

from marketplace.models import ApiKey, Role
from marketplace.models.accounts import role_covers
from marketplace.tenancy import membership_for


def api_membership(request):
    """The session user's membership in their active team (None for API keys)."""
    membership = getattr(request._request, "membership", None)
    if membership is None and request.user.is_authenticated and request.auth is None:
        team_id = request.session.get("active_team_id") if hasattr(request, "session") else None
        membership = membership_for(user=request.user, team_id=team_id)
    return membership


def api_team(request):
    if isinstance(request.auth, ApiKey):
        return request.auth.team
    membership = api_membership(request)
    return membership.team if membership is not None else None


def api_key_role(api_key: ApiKey) -> Role | None:
    """The role a key acts with (None: its creator is no longer in the team)."""
    return api_key.current_role


def api_role(request) -> Role | None:
    """The role the request acts with in its team, for a session or an API key alike."""
    if isinstance(request.auth, ApiKey):
        return api_key_role(request.auth)
    membership = api_membership(request)
    return Role(membership.role) if membership is not None else None


def read_only_methods(*methods: str) -> Callable:
    """Marks a function API view whose ``methods`` only read (a search with a JSON body), so
    read-only keys and viewers may use them. Put it above ``@api_view``."""

    def mark(view):
        view.cls.read_only_methods = frozenset(m.upper() for m in methods)
        return view

    return mark


def is_read(request, view) -> bool:
    return request.method in permissions.SAFE_METHODS or request.method in getattr(
        view, "read_only_methods", ()
    )


class TeamAccess(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        needed = (
            Role.VIEWER if is_read(request, view) else getattr(view, "required_role", Role.MEMBER)
        )
        if isinstance(request.auth, ApiKey):
            return self._key_allows(request.auth, view, Role(needed))
        membership = api_membership(request)
        if membership is None:
            raise exceptions.PermissionDenied("You belong to no team.")
        if not membership.allows(needed):
            raise exceptions.PermissionDenied(
                f"This needs the {Role(needed).label.lower()} role in the team; "
                f"you are {Role(membership.role).label.lower()}."
            )
        return True

    @staticmethod
    def _key_allows(api_key: ApiKey, view, needed: Role) -> bool:
        role = api_key_role(api_key)
        if role is None:
            raise exceptions.AuthenticationFailed(
                f"This API key stopped working: the member who created it is no longer in "
                f"{api_key.team.name}. Ask a team admin for a new key."
            )
        if getattr(view, "session_only", False):
            raise exceptions.PermissionDenied("This is managed in the console, not with a key.")
        audience = getattr(view, "audience", None)
        if audience and not api_key.allows_audience(audience):
            raise exceptions.PermissionDenied(f"This API key is not scoped for {audience}s.")
        if needed != Role.VIEWER and api_key.access != ApiKey.Access.WRITE:
            raise exceptions.PermissionDenied("This API key is read-only.")
        if not role_covers(role, needed):
            raise exceptions.PermissionDenied(
                f"This needs the {needed.label.lower()} role; the key acts with its creator's "
                f"current role ({role.label.lower()})."
            )
        return True
