"""Base classes that route every API query through the tenancy gateway."""

from __future__ import annotations

from rest_framework import viewsets

from marketplace.api.permissions import api_membership, api_team
from marketplace.tenancy import team_objects


class TeamScopedMixin:
    """``get_queryset`` returns only the acting team's rows of ``base_queryset``.

    Subclasses set ``base_queryset`` (a queryset of a model with a ``team`` field) and never
    override ``get_queryset`` without calling ``team_objects``; a foreign id then answers 404.
    """

    base_queryset = None

    def get_queryset(self):
        return team_objects(self.team, self.base_queryset.all())

    @property
    def team(self):
        return api_team(self.request)

    @property
    def membership(self):
        return api_membership(self.request)


class TeamScopedViewSet(TeamScopedMixin, viewsets.GenericViewSet):
    pass
