"""REST API for clusters: N replicas behind one authenticated, load-balanced URL."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from marketplace.api.base import TeamScopedViewSet
from marketplace.api.deployments import ReplicaSerializer
from marketplace.api.fields import FiniteFloatField
from marketplace.clusters.routes import gateway_url
from marketplace.clusters.services import (
    MAX_TARGET_RPS,
    MIN_CLUSTER_REPLICAS,
    ClusterSpec,
    cluster_create,
    cluster_delete,
    cluster_endpoint_close,
    cluster_endpoint_set,
    cluster_extend,
    cluster_resume,
    cluster_scale,
    cluster_stop,
    cluster_update,
)
from marketplace.deployments.reconciler import replica_counts
from marketplace.deployments.services import MAX_DISK_GB, MAX_GPUS_PER_REPLICA, MAX_REPLICAS
from marketplace.models import Cluster
from marketplace.models.deployments import ReplicaState
from marketplace.rentals.renting import MAX_RENTAL_HOURS, MIN_RENTAL_HOURS


class ClusterInputSerializer(serializers.Serializer):
    """What a team sets. On PATCH every field is optional (``partial``); the replicas, port
    and time have their own actions."""

    name = serializers.CharField(max_length=80)
    image = serializers.CharField(max_length=255)
    gpu_names = serializers.ListField(
        child=serializers.CharField(max_length=120), default=list, max_length=32,
        help_text='GPU models, any of them ("RTX 4090"); any model when empty.',
    )  # fmt: skip
    gpus_per_replica = serializers.IntegerField(
        min_value=1, max_value=MAX_GPUS_PER_REPLICA, default=1
    )
    replicas = serializers.IntegerField(
        min_value=MIN_CLUSTER_REPLICAS, max_value=MAX_REPLICAS, default=MIN_CLUSTER_REPLICAS
    )
    entrypoint = serializers.CharField(max_length=255, allow_blank=True, default="")
    args = serializers.ListField(
        child=serializers.CharField(max_length=4096, allow_blank=True), default=list, max_length=64
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=4096), default=dict
    )
    disk_gb = serializers.IntegerField(min_value=1, max_value=MAX_DISK_GB, default=10)
    duration_hours = FiniteFloatField(
        min_value=MIN_RENTAL_HOURS, max_value=MAX_RENTAL_HOURS, default=1.0,
        help_text="The cluster ends after this long unless extended; each replica holds for it.",
    )  # fmt: skip
    service_port = serializers.IntegerField(
        min_value=1, max_value=65535, allow_null=True, default=None,
        help_text="The container port the URL forwards to; no URL when null (open one later).",
    )  # fmt: skip
    min_replicas = serializers.IntegerField(
        min_value=MIN_CLUSTER_REPLICAS, max_value=MAX_REPLICAS, allow_null=True, default=None
    )
    max_replicas = serializers.IntegerField(
        min_value=MIN_CLUSTER_REPLICAS, max_value=MAX_REPLICAS, allow_null=True, default=None
    )
    target_rps_per_replica = FiniteFloatField(
        min_value=0.001, max_value=MAX_TARGET_RPS, allow_null=True, default=None,
        help_text="Autoscaling: requests per second each replica should serve.",
    )  # fmt: skip


# The GPUs are not: a cluster on other GPUs is another cluster (its replicas would all be
# replaced at once); the replicas, port and time have their own actions.
PATCHABLE = {
    "name", "image", "entrypoint", "args", "env", "disk_gb",
    "min_replicas", "max_replicas", "target_rps_per_replica",
}  # fmt: skip


class ClusterScaleSerializer(serializers.Serializer):
    replicas = serializers.IntegerField(min_value=MIN_CLUSTER_REPLICAS, max_value=MAX_REPLICAS)


class ClusterEndpointSerializer(serializers.Serializer):
    port = serializers.IntegerField(min_value=1, max_value=65535)


class ClusterExtendSerializer(serializers.Serializer):
    hours = FiniteFloatField(min_value=MIN_RENTAL_HOURS, max_value=MAX_RENTAL_HOURS)


class ClusterSerializer(serializers.ModelSerializer):
    name = serializers.CharField(source="deployment.name")
    image = serializers.CharField(source="deployment.image")
    gpu_names = serializers.ListField(source="deployment.gpu_names")
    gpus_per_replica = serializers.IntegerField(source="deployment.gpus_per_replica")
    entrypoint = serializers.CharField(source="deployment.entrypoint")
    args = serializers.ListField(source="deployment.args")
    env = serializers.DictField(source="deployment.env")
    disk_gb = serializers.IntegerField(source="deployment.disk_gb")
    deployment_id = serializers.IntegerField()
    running = serializers.SerializerMethodField()
    queued = serializers.SerializerMethodField()
    queue_reason = serializers.CharField(source="deployment.queue_reason")
    url = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        fields = [
            "id", "name", "state", "image", "gpu_names", "gpus_per_replica", "replicas",
            "min_replicas", "max_replicas", "target_rps_per_replica", "entrypoint", "args",
            "env", "disk_gb", "service_port", "url", "running", "queued", "queue_reason",
            "ends_at", "deployment_id", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields

    def _counts(self, cluster) -> dict[str, int]:
        cache = self.context.setdefault("counts", {})
        if cluster.pk not in cache:
            cache[cluster.pk] = replica_counts(cluster.deployment)
        return cache[cluster.pk]

    def get_running(self, cluster) -> int:
        """Replicas whose containers run now."""
        return self._counts(cluster)[ReplicaState.RUNNING]

    def get_queued(self, cluster) -> int:
        return self._counts(cluster)[ReplicaState.QUEUED]

    def get_url(self, cluster) -> str | None:
        """The cluster's URL (null until a service port is set): only its team gets through."""
        return gateway_url(cluster.pk) if cluster.service_port else None


class ClusterViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """The team's clusters. POST creates one (its replicas are placed at once, each with a
    hold); PATCH changes what they run (rolled one replica at a time); DELETE ends it."""

    base_queryset = Cluster.objects.select_related("deployment")
    serializer_class = ClusterSerializer
    audience = "renter"
    filterset_fields = ["state"]

    def _answer(self, cluster, code=status.HTTP_200_OK) -> Response:
        current = self.get_queryset().get(pk=cluster.pk)
        return Response(ClusterSerializer(current).data, status=code)

    @extend_schema(request=ClusterInputSerializer, responses={201: ClusterSerializer})
    def create(self, request):
        params = ClusterInputSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        cluster = cluster_create(team=self.team, spec=ClusterSpec(**params.validated_data))
        return self._answer(cluster, status.HTTP_201_CREATED)

    @extend_schema(request=ClusterInputSerializer, responses={200: ClusterSerializer})
    def partial_update(self, request, pk=None):
        # The body first: what it says is wrong whichever cluster it is sent to.
        fixed = sorted(set(request.data) - PATCHABLE) if hasattr(request.data, "keys") else []
        if fixed:
            raise serializers.ValidationError(
                dict.fromkeys(
                    fixed,
                    "Not changed by PATCH: replicas, port and time have scale/, endpoint/ and "
                    "extend/; other GPUs need another cluster.",
                )
            )
        params = ClusterInputSerializer(data=request.data, partial=True)
        params.is_valid(raise_exception=True)
        cluster = cluster_update(cluster=self.get_object(), changes=dict(params.validated_data))
        return self._answer(cluster)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        cluster_delete(cluster=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=ClusterScaleSerializer, responses={200: ClusterSerializer})
    @action(detail=True, methods=["post"])
    def scale(self, request, pk=None):
        params = ClusterScaleSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        cluster = cluster_scale(
            cluster=self.get_object(), replicas=params.validated_data["replicas"]
        )
        return self._answer(cluster)

    @extend_schema(request=ClusterEndpointSerializer, responses={200: ClusterSerializer})
    @action(detail=True, methods=["put", "delete"])
    def endpoint(self, request, pk=None):
        if request.method == "DELETE":
            return self._answer(cluster_endpoint_close(cluster=self.get_object()))
        params = ClusterEndpointSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        port = params.validated_data["port"]
        return self._answer(cluster_endpoint_set(cluster=self.get_object(), port=port))

    @extend_schema(request=None, responses={200: ClusterSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        return self._answer(cluster_stop(cluster=self.get_object()))

    @extend_schema(request=None, responses={200: ClusterSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._answer(cluster_resume(cluster=self.get_object()))

    @extend_schema(request=ClusterExtendSerializer, responses={200: ClusterSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        params = ClusterExtendSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        hours = params.validated_data["hours"]
        return self._answer(cluster_extend(cluster=self.get_object(), hours=hours))

    @extend_schema(responses={200: ReplicaSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def replicas(self, request, pk=None):
        cluster = self.get_object()
        replicas = cluster.deployment.replicas.select_related("instance").order_by(
            "created_at", "pk"
        )
        return Response(ReplicaSerializer(replicas, many=True).data)
