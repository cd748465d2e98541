"""REST API for templates: a team's saved launch settings (``/api/v1/templates/``), and renting
from one (``POST /api/v1/templates/<id>/rent/``).

The list and a template's page show the team's own templates and every public one; changing
or deleting one is for its team alone (another team's answers 404, public or not)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from marketplace.api.base import TeamScopedViewSet
from marketplace.api.permissions import api_membership
from marketplace.api.rent_requests import RentSerializer, rent_request
from marketplace.api.rentals import InstanceSerializer, rented_data
from marketplace.models import ApiKey, Template
from marketplace.rentals.renting import rental_create
from marketplace.services.templates import (
    template_create,
    template_delete,
    template_settings,
    template_update,
)
from marketplace.tenancy import team_objects, team_or_public_objects


class TemplateSerializer(serializers.ModelSerializer):
    # Values and arguments are kept exactly as sent, as a rent request keeps them.
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=4096, trim_whitespace=False),
        required=False,
    )
    ports = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=65535), required=False, max_length=16
    )
    args = serializers.ListField(
        child=serializers.CharField(max_length=4096, allow_blank=True, trim_whitespace=False),
        required=False,
        max_length=64,
    )
    disk_gb = serializers.IntegerField(min_value=1, max_value=100_000, required=False)
    mine = serializers.SerializerMethodField(help_text="the acting team's own template")

    class Meta:
        model = Template
        fields = [
            "id", "hash_id", "name", "description", "readme", "public", "image", "launch_mode",
            "entrypoint", "args", "env", "ports", "disk_gb", "mine", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["id", "hash_id", "mine", "created_at", "updated_at"]

    def get_mine(self, template: Template) -> bool:
        return template.team_id == self.context["team"].pk


class TemplateViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    TeamScopedViewSet,
):
    """The team's templates and the public ones. POST saves one; PATCH/DELETE change the
    team's own; ``rent`` rents an offer with a template's settings."""

    base_queryset = Template.objects.all()
    serializer_class = TemplateSerializer
    audience = "renter"
    filterset_fields = ["public", "hash_id"]

    def get_queryset(self):
        readable = team_or_public_objects(self.team, self.base_queryset.all())
        if self.action in ("update", "partial_update", "destroy"):
            return team_objects(self.team, self.base_queryset.all())
        return readable

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "team": self.team}

    def perform_create(self, serializer):
        membership = api_membership(self.request)
        user = membership.user if membership is not None else None
        if isinstance(self.request.auth, ApiKey):
            user = self.request.auth.created_by
        serializer.instance = template_create(
            team=self.team, user=user, fields=dict(serializer.validated_data)
        )

    def perform_update(self, serializer):
        serializer.instance = template_update(
            template=serializer.instance, fields=dict(serializer.validated_data)
        )

    def perform_destroy(self, instance):
        template_delete(template=instance)

    @extend_schema(
        request=RentSerializer,
        responses={201: InstanceSerializer},
        summary="Rent an offer with the template's settings",
        description="The body is a rent request (POST /api/v1/instances/) whose launch "
        "settings default to the template's: give machine_id, num_gpus and duration_hours, "
        "and any setting to change.",
    )
    @action(detail=True, methods=["post"])
    def rent(self, request, pk=None):
        template = self.get_object()
        if not isinstance(request.data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Send a JSON object."]})
        rented = rental_create(
            team=self.team, request=rent_request({**template_settings(template), **request.data})
        )
        return Response(rented_data(rented), status=status.HTTP_201_CREATED)
