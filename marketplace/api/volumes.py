"""REST API for volumes: storage of a fixed, enforced size on one machine that rentals on
that machine mount (``"volumes": [{"volume": id, "target": "/data"}]`` when renting)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from hosts.runtime.volumes import MAX_VOLUME_GB
from marketplace.api.base import TeamScopedViewSet
from marketplace.api.fields import DOLLARS_SCHEMA, FiniteFloatField, dollars
from marketplace.api.rent_requests import ExtendSerializer
from marketplace.models import Volume, VolumeState
from marketplace.rentals.volumes import (
    DEFAULT_VOLUME_HOURS,
    MAX_VOLUME_HOURS,
    volume_clone,
    volume_create,
    volume_delete,
    volume_extend,
    volume_resize,
    volume_usage,
)

MAX_ID = 2**63 - 1


class VolumeSerializer(serializers.ModelSerializer):
    machine_id = serializers.IntegerField(read_only=True)
    storage_price_per_gb_month = serializers.SerializerMethodField()
    mounted_by = serializers.SerializerMethodField()
    version = serializers.SerializerMethodField()
    cloned_from = serializers.PrimaryKeyRelatedField(read_only=True)

    class Meta:
        model = Volume
        fields = [
            "id", "name", "machine_id", "size_gb", "state", "failure", "version", "mounted_by",
            "storage_price_per_gb_month", "ends_at", "created_at", "deleted_at", "cloned_from",
        ]  # fmt: skip

    @extend_schema_field(DOLLARS_SCHEMA)
    def get_storage_price_per_gb_month(self, volume) -> str:
        return dollars(volume.storage_price_per_gb_month)

    def get_mounted_by(self, volume) -> list[int]:
        """The team's instances (not destroyed) that mount it."""
        return sorted(
            mount.instance_id
            for mount in volume.mounts.all()
            if mount.instance.state != "destroyed"
        )

    def get_version(self, volume) -> int:
        return max((v.number for v in volume.versions.all()), default=1)


class VolumeCreateSerializer(serializers.Serializer):
    machine_id = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    name = serializers.CharField(max_length=64)
    size_gb = serializers.IntegerField(min_value=1, max_value=MAX_VOLUME_GB)
    duration_hours = FiniteFloatField(
        min_value=1, max_value=MAX_VOLUME_HOURS, default=DEFAULT_VOLUME_HOURS,
        help_text="How long it is held (and charged) for; 30 days by default.",
    )  # fmt: skip


class VolumeCloneSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    size_gb = serializers.IntegerField(
        min_value=1, max_value=MAX_VOLUME_GB, required=False,
        help_text="At least the source's size; the source's size when left out.",
    )  # fmt: skip
    duration_hours = FiniteFloatField(
        min_value=1, max_value=MAX_VOLUME_HOURS, default=DEFAULT_VOLUME_HOURS,
        help_text="How long the clone is held (and charged) for; 30 days by default.",
    )  # fmt: skip


class VolumeResizeSerializer(serializers.Serializer):
    size_gb = serializers.IntegerField(min_value=1, max_value=MAX_VOLUME_GB)


class VolumeVersionSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    size_gb = serializers.IntegerField()
    change = serializers.CharField()
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


class VolumeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """The team's volumes. POST creates one on a machine (held for its period), PATCH
    resizes it (a new version), ``extend`` lengthens its period, DELETE removes it once
    nothing mounts it (``removing`` until its host has done it)."""

    base_queryset = (
        Volume.objects.exclude(state=VolumeState.DELETED)
        .select_related("machine")
        .prefetch_related("mounts__instance", "versions")
    )
    serializer_class = VolumeSerializer
    audience = "renter"
    filterset_fields = ["machine_id"]

    def _actor(self):
        """Who made a version: the signed-in user, or the API key's creator."""
        membership = self.membership
        return membership.user if membership is not None else None

    def _answer(self, volume, code=status.HTTP_200_OK, **extra) -> Response:
        current = Volume.objects.prefetch_related("mounts__instance", "versions").get(pk=volume.pk)
        return Response({**VolumeSerializer(current).data, **extra}, status=code)

    @extend_schema(request=VolumeCreateSerializer, responses={201: VolumeSerializer})
    def create(self, request):
        params = VolumeCreateSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        volume = volume_create(
            team=self.team,
            user=self._actor(),
            machine_id=data["machine_id"],
            name=data["name"],
            size_gb=data["size_gb"],
            hours=data["duration_hours"],
        )
        return self._answer(volume, status.HTTP_201_CREATED)

    @extend_schema(request=VolumeCloneSerializer, responses={201: VolumeSerializer})
    @action(detail=True, methods=["post"])
    def clone(self, request, pk=None):
        """A new volume on the same machine with a copy of this one's files (``creating`` until
        its host has made and filled it; ``failed`` with the reason otherwise)."""
        source = self.get_object()
        params = VolumeCloneSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        clone = volume_clone(
            source=source,
            user=self._actor(),
            name=data["name"],
            size_gb=data.get("size_gb"),
            hours=data["duration_hours"],
        )
        return self._answer(clone, status.HTTP_201_CREATED)

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def usage(self, request, pk=None):
        """What it stores now and its size, read on its host (503 when the host does not
        answer)."""
        volume = self.get_object()
        usage = volume_usage(volume)
        return Response(
            {"id": volume.pk, "used_bytes": usage.used_bytes, "size_bytes": usage.size_bytes}
        )

    @extend_schema(request=VolumeResizeSerializer, responses={200: VolumeSerializer})
    def partial_update(self, request, pk=None):
        params = VolumeResizeSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        volume = volume_resize(
            volume=self.get_object(),
            size_gb=params.validated_data["size_gb"],
            user=self._actor(),
        )
        return self._answer(volume)

    @extend_schema(request=ExtendSerializer, responses={200: VolumeSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        """Add hours to its period, and their storage to its hold (402 when short)."""
        volume = self.get_object()
        params = ExtendSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        volume = volume_extend(volume=volume, hours=params.validated_data["hours"])
        return self._answer(volume)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, pk=None):
        volume_delete(volume=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses={200: VolumeVersionSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def versions(self, request, pk=None):
        """Each size the volume had, oldest first: 1 at creation, one more per resize."""
        volume = self.get_object()
        rows = volume.versions.select_related("created_by").order_by("number")
        return Response(
            [
                {
                    "number": v.number,
                    "size_gb": v.size_gb,
                    "change": v.change,
                    "created_by": v.created_by.get_username() if v.created_by else None,
                    "created_at": serializers.DateTimeField().to_representation(v.created_at),
                }
                for v in rows
            ]
        )
