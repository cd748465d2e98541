"""REST API for the team's environment variables (``/api/v1/env-vars/``): secrets every new
instance of the team gets in its environment. Values go in and are never shown back: a list
shows the names."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.api.permissions import api_team
from marketplace.models import TeamEnvVar
from marketplace.services.env_vars import (
    HIDDEN,
    env_var_create,
    env_var_delete,
    env_var_update,
)
from marketplace.tenancy import team_objects


class EnvVarSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=128)
    value = serializers.CharField(
        max_length=4096, allow_blank=True, trim_whitespace=False, write_only=True,
        help_text="Never shown back.",
    )  # fmt: skip


class EnvVarValueSerializer(serializers.Serializer):
    value = serializers.CharField(max_length=4096, allow_blank=True, trim_whitespace=False)


def env_var_row(variable: TeamEnvVar) -> dict:
    return {
        "name": variable.name,
        "value": HIDDEN,
        "created_at": variable.created_at,
        "updated_at": variable.updated_at,
    }


class EnvVars(APIView):
    """The team's variables (GET: names only) and a new one (POST)."""

    audience = "renter"

    @extend_schema(responses={200: {"type": "array", "items": {"type": "object"}}})
    def get(self, request):
        variables = team_objects(api_team(request), TeamEnvVar.objects.all())
        return Response([env_var_row(v) for v in variables])

    @extend_schema(request=EnvVarSerializer, responses={201: {"type": "object"}})
    def post(self, request):
        params = EnvVarSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        variable = env_var_create(team=api_team(request), **params.validated_data)
        return Response(env_var_row(variable), status=status.HTTP_201_CREATED)


class EnvVarDetail(APIView):
    """A new value for one variable (PATCH), or none (DELETE). Instances launched before keep
    what they were given."""

    audience = "renter"

    @extend_schema(request=EnvVarValueSerializer, responses={200: {"type": "object"}})
    def patch(self, request, name: str):
        params = EnvVarValueSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        variable = env_var_update(team=api_team(request), name=name, **params.validated_data)
        return Response(env_var_row(variable))

    @extend_schema(responses={204: None})
    def delete(self, request, name: str):
        env_var_delete(team=api_team(request), name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)
