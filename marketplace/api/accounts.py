"""API for the acting team: who am I, members, invitations, API keys."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from marketplace.api.base import TeamScopedViewSet
from marketplace.api.permissions import api_role, api_team
from marketplace.models import ApiKey, Invitation, Membership, Role
from marketplace.services import accounts as services


class TeamSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    personal = serializers.BooleanField()


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    team = TeamSerializer()
    role = serializers.CharField(allow_null=True)
    api_key = serializers.DictField(allow_null=True)


@extend_schema(responses=MeSerializer, summary="Who the request acts as")
@api_view(["GET"])
def me(request):
    team = api_team(request)
    role = api_role(request)
    api_key = request.auth if isinstance(request.auth, ApiKey) else None
    return Response(
        {
            "username": str(request.user.username),
            "team": {"id": team.id, "name": team.name, "personal": team.personal},
            "role": role.value if role else None,
            "api_key": (
                {"prefix": api_key.prefix, "access": api_key.access, "audience": api_key.audience}
                if api_key
                else None
            ),
        }
    )


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    email = serializers.EmailField(source="user.email", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "username", "email", "role", "created_at"]
        read_only_fields = ["id", "username", "email", "created_at"]


class MemberViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    TeamScopedViewSet,
):
    """Members of the acting team. Changing roles and removing need the admin role."""

    base_queryset = Membership.objects.select_related("user").order_by("created_at")
    serializer_class = MembershipSerializer
    required_role = Role.ADMIN
    session_only = True
    http_method_names = ["get", "patch", "delete"]

    def perform_update(self, serializer):
        # A PATCH is partial, so the serializer lets a body without "role" through; a member's
        # role is the one thing there is to change.
        if "role" not in serializer.validated_data:
            raise serializers.ValidationError({"role": "Give the member's new role."})
        role = Role(serializer.validated_data["role"])
        services.membership_set_role(actor=self.membership, target=serializer.instance, role=role)

    def perform_destroy(self, instance):
        services.membership_remove(actor=self.membership, target=instance)


class InvitationSerializer(serializers.ModelSerializer):
    invite_url = serializers.SerializerMethodField()
    status = serializers.CharField(read_only=True, help_text="open or expired")

    class Meta:
        model = Invitation
        fields = [
            "id", "email", "role", "status", "created_at", "expires_at", "accepted_at",
            "invite_url",
        ]  # fmt: skip
        read_only_fields = ["id", "status", "created_at", "expires_at", "accepted_at", "invite_url"]

    def get_invite_url(self, obj) -> str | None:
        token = self.context.get("token")
        if not token:
            return None
        return self.context["request"].build_absolute_uri(f"/invitations/{token}/")


class InvitationViewSet(
    mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin, TeamScopedViewSet
):
    base_queryset = Invitation.objects.filter(accepted_at=None, revoked_at=None)
    serializer_class = InvitationSerializer
    required_role = Role.ADMIN
    session_only = True

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        issued = services.invitation_create(
            membership=self.membership,
            email=serializer.validated_data["email"],
            role=Role(serializer.validated_data.get("role", Role.MEMBER)),
        )
        body = InvitationSerializer(
            issued.invitation, context={"request": request, "token": issued.token}
        ).data
        return Response(body, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.invitation_revoke(membership=self.membership, invitation=instance)


class ApiKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiKey
        fields = [
            "id", "name", "prefix", "access", "audience", "created_at", "expires_at",
            "revoked_at", "last_used_at",
        ]  # fmt: skip
        read_only_fields = ["id", "prefix", "created_at", "revoked_at", "last_used_at"]


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="The full key. Shown once, never again.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]


class ApiKeyViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
    mixins.DestroyModelMixin, TeamScopedViewSet,
):  # fmt: skip
    """The team's API keys. DELETE revokes a key (it stays listed, marked revoked)."""

    base_queryset = ApiKey.objects.all()
    serializer_class = ApiKeySerializer
    required_role = Role.ADMIN
    session_only = True

    @extend_schema(responses={201: ApiKeyCreatedSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        issued = services.api_key_create(membership=self.membership, **serializer.validated_data)
        body = ApiKeyCreatedSerializer(issued.api_key).data
        body["key"] = issued.secret
        return Response(body, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.api_key_revoke(membership=self.membership, api_key=instance)
