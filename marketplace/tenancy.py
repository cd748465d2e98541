"""The tenancy gateway: every query that serves a request goes through here.

A request acts for exactly one team: the API key's team, or the console's active team (kept in
the session and switched in the header). ``team_objects`` scopes any queryset with a ``team``
field to that team, and ``team_object_or_404`` answers 404 for another team's object, so an
outsider cannot even learn that an id exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest

from marketplace.models import Membership, Role, Team
from marketplace.services.accounts import personal_team_ensure

if TYPE_CHECKING:
    from marketplace.models import User

M = TypeVar("M", bound=Model)

ACTIVE_TEAM_SESSION_KEY = "active_team_id"


class NoTeam(Exception):
    """The request acts for no team (anonymous, or a user who belongs to none)."""


def membership_for(*, user: User, team_id: int | None) -> Membership | None:
    memberships = Membership.objects.select_related("team").filter(user=user)
    if team_id is not None:
        found = memberships.filter(team_id=team_id).first()
        if found is not None:
            return found
    # Fall back to the personal team, then the oldest membership.
    return memberships.order_by("-team__personal", "created_at").first()


def request_team(request: HttpRequest) -> Team:
    team = getattr(request, "team", None)
    if team is None:
        raise NoTeam
    return team


def team_objects(team: Team, queryset: QuerySet[M]) -> QuerySet[M]:
    """The one scoping rule: a team sees only rows whose ``team`` is itself."""
    return queryset.filter(team=team)


def team_or_public_objects(team: Team, queryset: QuerySet[M]) -> QuerySet[M]:
    """What a team may read of a model whose rows may be shared (``public``, like templates):
    its own rows and every public one. Changing a row stays ``team_objects``' rule."""
    from django.db.models import Q

    return queryset.filter(Q(team=team) | Q(public=True))


def team_object_or_404(team: Team, queryset: QuerySet[M], **lookup: object) -> M:
    try:
        return team_objects(team, queryset).get(**lookup)
    except queryset.model.DoesNotExist as error:
        raise Http404 from error
    except (ValueError, TypeError) as error:  # a malformed id is just "not found"
        raise Http404 from error


def role_allows(request: HttpRequest, needed: Role) -> bool:
    membership = getattr(request, "membership", None)
    return membership is not None and membership.allows(needed)


def acting_membership(user: User, team_id: int | None) -> Membership:
    """The membership a signed-in user acts with. A user who belongs to no team at all (made
    before every account got a personal team, or whose rows were edited by hand) gets their
    personal team now, so a console page never meets a request without a team."""
    membership = membership_for(user=user, team_id=team_id)
    if membership is None:
        personal_team_ensure(user=user)
        membership = membership_for(user=user, team_id=None)
    return membership


class ActiveTeamMiddleware:
    """Puts the console's active team and the user's membership on the request."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        request.team = None
        request.membership = None
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            membership = acting_membership(user, request.session.get(ACTIVE_TEAM_SESSION_KEY))
            request.team = membership.team
            request.membership = membership
        return self.get_response(request)


def team_context(request: HttpRequest) -> dict[str, object]:
    """Template context: the active team, the teams to switch between, a low-balance notice."""
    from marketplace.selectors import low_balance_notice

    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    team = getattr(request, "team", None)
    return {
        "active_team": team,
        "low_balance": low_balance_notice(team.pk) if team is not None else None,
        "active_membership": getattr(request, "membership", None),
        "my_memberships": Membership.objects.select_related("team")
        .filter(user=user)
        .order_by("-team__personal", "team__name"),
    }
