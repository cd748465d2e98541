"""Who may do what through the API.

A request acts for one team. Reads need any membership (viewer and up) or any key; writes
need the member role or a read-write key; views may ask for more (``required_role``) or for a
side of the market (``audience``: "renter" or "provider").
"""

from __future__ import annotations

from rest_framework import exceptions, permissions

from marketplace.models import ApiKey, Role
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


class TeamAccess(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        audience = getattr(view, "audience", None)
        api_key = request.auth if isinstance(request.auth, ApiKey) else None
        if api_key is not None:
            if getattr(view, "session_only", False):
                raise exceptions.PermissionDenied("This is managed in the console, not with a key.")
            if audience and not api_key.allows_audience(audience):
                raise exceptions.PermissionDenied(f"This API key is not scoped for {audience}s.")
            if (
                request.method not in permissions.SAFE_METHODS
                and api_key.access != ApiKey.Access.WRITE
            ):
                raise exceptions.PermissionDenied("This API key is read-only.")
            return True
        membership = api_membership(request)
        if membership is None:
            raise exceptions.PermissionDenied("You belong to no team.")
        if request.method in permissions.SAFE_METHODS:
            return True
        needed = getattr(view, "required_role", Role.MEMBER)
        if not membership.allows(needed):
            raise exceptions.PermissionDenied(
                f"This needs the {Role(needed).label.lower()} role in the team."
            )
        return True
