"""REST API for deployments: conditions instead of a machine; the reconciler places replicas."""

from __future__ import annotations

from dataclasses import fields

from django.db.models import Prefetch
from django.http import Http404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from marketplace.api.base import TeamScopedViewSet
from marketplace.api.fields import DollarsField, FiniteFloatField
from marketplace.api.rent_requests import GpuShareSerializer
from marketplace.deployments.reconciler import replica_counts, wanted_live
from marketplace.deployments.scaling import unreachable
from marketplace.deployments.services import (
    MAX_DISK_GB,
    MAX_GPUS_PER_REPLICA,
    MAX_REPLICAS,
    DeploymentSpec,
    deployment_create,
    deployment_delete,
    deployment_stop,
    deployment_update,
    replica_stop,
)
from marketplace.models import Cluster, Deployment, Replica
from marketplace.models.deployments import DeploymentMode, PlacementPolicy, ReplicaState
from marketplace.rentals.renting import MAX_RENTAL_HOURS, MIN_RENTAL_HOURS
from scheduler import services as scheduler
from scheduler.models import Instance, LaunchMode
from scheduler.placement import BINPACK, CARD_POLICIES

# API name → DeploymentSpec field, where they differ.
RENAMED = {"replicas": "replica_count", "budget_usd": "budget"}


class DeploymentInputSerializer(serializers.Serializer):
    """What a team sets. On PATCH every field is optional (``partial``)."""

    name = serializers.CharField(max_length=80)
    mode = serializers.ChoiceField(
        choices=DeploymentMode.choices, default=DeploymentMode.REPLICASET
    )
    image = serializers.CharField(max_length=255)
    launch_mode = serializers.ChoiceField(choices=LaunchMode.choices, default=LaunchMode.ENTRYPOINT)
    entrypoint = serializers.CharField(max_length=255, allow_blank=True, default="")
    args = serializers.ListField(
        child=serializers.CharField(max_length=4096, allow_blank=True), default=list, max_length=64
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=4096), default=dict
    )
    ports = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=65535), default=list, max_length=16
    )
    disk_gb = serializers.IntegerField(min_value=1, max_value=MAX_DISK_GB, default=50)
    gpu_names = serializers.ListField(
        child=serializers.CharField(max_length=120), default=list, max_length=32,
        help_text='GPU models, any of them ("RTX 4090"); any model when empty.',
    )  # fmt: skip
    gpus_per_replica = serializers.IntegerField(
        min_value=1, max_value=MAX_GPUS_PER_REPLICA, default=1
    )
    max_price_per_gpu_hour = DollarsField(
        allow_null=True, default=None, help_text="Dollars per GPU-hour; no cap when null."
    )
    regions = serializers.ListField(
        child=serializers.CharField(max_length=64), default=list, max_length=32
    )
    min_reliability = FiniteFloatField(min_value=0, max_value=1, default=0.0)
    policy = serializers.ChoiceField(
        choices=PlacementPolicy.choices, default=PlacementPolicy.SPREAD
    )
    replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, default=1)
    completions = serializers.IntegerField(min_value=1, max_value=100_000, default=1)
    backoff_limit = serializers.IntegerField(min_value=0, max_value=1000, default=6)
    duration_hours = FiniteFloatField(
        min_value=MIN_RENTAL_HOURS, max_value=MAX_RENTAL_HOURS, default=1.0,
        help_text="Each replica's rental holds credit for this long.",
    )  # fmt: skip
    budget_usd = DollarsField(
        allow_null=True,
        default=None,
        help_text="Dollars the replicas' rentals may spend or hold at once; no cap when null.",
    )
    gpu_share = GpuShareSerializer(
        allow_null=True,
        default=None,
        help_text="Each replica takes a slice of one card instead of whole GPUs (machines "
        "that share their cards); gpus_per_replica is then 1.",
    )
    card_policy = serializers.ChoiceField(
        choices=CARD_POLICIES,
        default=BINPACK,
        help_text="Which card a slice goes on once policy chose the machine: binpack (the "
        "fullest that fits) or spread (the emptiest).",
    )

    def spec_values(self) -> dict:
        """The validated fields under DeploymentSpec's names (only those given, on PATCH)."""
        known = {f.name for f in fields(DeploymentSpec)}
        data = dict(self.validated_data)
        if "gpu_share" in data:
            share = data.pop("gpu_share") or {}
            data["slice_core_percent"] = share.get("core_percent")
            data["slice_memory_mb"] = share.get("memory_mb")
        values = {RENAMED.get(name, name): value for name, value in data.items()}
        return {name: value for name, value in values.items() if name in known}


class DeploymentSerializer(serializers.ModelSerializer):
    replicas = serializers.IntegerField(source="replica_count")
    max_price_per_gpu_hour = DollarsField(allow_null=True)
    budget_usd = DollarsField(source="budget", allow_null=True)
    desired = serializers.SerializerMethodField()
    running = serializers.SerializerMethodField()
    queued = serializers.SerializerMethodField()
    completed = serializers.SerializerMethodField()
    failed = serializers.SerializerMethodField()
    gpu_share = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "id", "name", "mode", "state", "image", "launch_mode", "entrypoint", "args", "env",
            "ports", "disk_gb", "gpu_names", "gpus_per_replica", "gpu_share", "card_policy",
            "max_price_per_gpu_hour",
            "regions", "min_reliability", "policy", "replicas", "completions", "backoff_limit",
            "duration_hours", "budget_usd", "desired", "running", "queued", "completed",
            "failed", "queue_reason", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields

    def _counts(self, deployment) -> dict[str, int]:
        cache = self.context.setdefault("counts", {})
        if deployment.pk not in cache:
            cache[deployment.pk] = replica_counts(deployment)
        return cache[deployment.pk]

    def get_desired(self, deployment) -> int:
        """Replicas that should be live now (a job's shrinks as completions come in)."""
        return wanted_live(deployment)

    def get_running(self, deployment) -> int:
        counts = self._counts(deployment)
        return counts[ReplicaState.RUNNING] + counts[ReplicaState.PLACED]

    def get_queued(self, deployment) -> int:
        return self._counts(deployment)[ReplicaState.QUEUED]

    def get_completed(self, deployment) -> int:
        return self._counts(deployment)[ReplicaState.SUCCEEDED]

    def get_failed(self, deployment) -> int:
        return self._counts(deployment)[ReplicaState.FAILED]

    @extend_schema_field(GpuShareSerializer(allow_null=True))
    def get_gpu_share(self, deployment) -> dict | None:
        size = deployment.gpu_slice
        return (
            None
            if size is None
            else {"core_percent": size.core_percent, "memory_mb": size.memory_mb}
        )


class ReplicaSerializer(serializers.ModelSerializer):
    instance_id = serializers.IntegerField(allow_null=True)
    machine_id = serializers.SerializerMethodField()
    gpus = serializers.SerializerMethodField()
    container_name = serializers.SerializerMethodField()
    unreachable_since = serializers.SerializerMethodField()

    class Meta:
        model = Replica
        fields = [
            "id", "state", "reason", "instance_id", "machine_id", "gpus", "container_name",
            "exit_code", "created_at", "started_at", "ended_at", "unreachable_since",
        ]  # fmt: skip
        read_only_fields = fields

    def get_machine_id(self, replica) -> int | None:
        return replica.instance.machine_id if replica.instance else None

    def get_gpus(self, replica) -> list[str]:
        """The GPUs (UUIDs) it holds now; none once ended."""
        if replica.instance is None or not replica.is_live:
            return []
        return scheduler.instance_gpu_uuids(replica.instance)

    def get_container_name(self, replica) -> str | None:
        return replica.instance.container_name if replica.instance else None

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_unreachable_since(self, replica) -> str | None:
        """Since when a live replica's host has not answered (it is kept for
        REPLICA_UNREACHABLE_GRACE_MINUTES, and a replica set places others meanwhile); null
        while its host answers."""
        if not replica.is_live or not unreachable(replica):
            return None
        return serializers.DateTimeField().to_representation(replica.instance.state_changed_at)


class DeploymentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """The team's deployments. POST creates one (its replicas are placed or queued at once);
    PATCH changes the count, conditions, spec or policy; DELETE stops it and forgets it."""

    base_queryset = Deployment.objects.all()
    serializer_class = DeploymentSerializer
    audience = "renter"
    filterset_fields = ["state", "mode"]

    def _changeable(self) -> Deployment:
        """The deployment a write acts on. A cluster's is the cluster's to change: through
        the clusters API, which keeps its bounds, its endpoint and the gateway's routes."""
        deployment = self.get_object()
        cluster_id = (
            Cluster.objects.filter(deployment=deployment).values_list("pk", flat=True).first()
        )
        if cluster_id is not None:
            raise serializers.ValidationError(
                {"cluster": f"This deployment serves cluster {cluster_id}; change it through "
                            f"/api/v1/clusters/{cluster_id}/."}
            )  # fmt: skip
        return deployment

    def _answer(self, deployment, code=status.HTTP_200_OK) -> Response:
        current = self.get_queryset().get(pk=deployment.pk)
        return Response(DeploymentSerializer(current).data, status=code)

    @extend_schema(request=DeploymentInputSerializer, responses={201: DeploymentSerializer})
    def create(self, request):
        params = DeploymentInputSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        deployment = deployment_create(team=self.team, spec=DeploymentSpec(**params.spec_values()))
        return self._answer(deployment, status.HTTP_201_CREATED)

    @extend_schema(request=DeploymentInputSerializer, responses={200: DeploymentSerializer})
    def partial_update(self, request, pk=None):
        # The body first: what it says is wrong whichever deployment it is sent to.
        if "mode" in request.data:
            raise serializers.ValidationError({"mode": "The mode cannot be changed."})
        params = DeploymentInputSerializer(data=request.data, partial=True)
        params.is_valid(raise_exception=True)
        deployment = self._changeable()
        deployment = deployment_update(deployment=deployment, changes=params.spec_values())
        return self._answer(deployment)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        deployment_delete(deployment=self._changeable())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        deployment = deployment_stop(deployment=self._changeable())
        return self._answer(deployment)

    @extend_schema(responses={200: ReplicaSerializer(many=True)})
    @action(detail=True, methods=["get"], url_path="replicas")
    def replicas(self, request, pk=None):
        # The page parameters first: what they say is wrong whichever deployment it is.
        self.paginate_queryset(Replica.objects.none())
        deployment = self.get_object()
        # Each replica's instance with the GPUs it holds, for the page in a few statements.
        replicas = deployment.replicas.prefetch_related(
            Prefetch("instance", scheduler.with_live_holdings(Instance.objects.all()))
        ).order_by("created_at", "pk")
        page = self.paginate_queryset(replicas)
        data = ReplicaSerializer(page if page is not None else replicas, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    @extend_schema(request=None, responses={200: ReplicaSerializer})
    @action(detail=True, methods=["post"], url_path=r"replicas/(?P<replica_id>\d{1,18})/stop")
    def replica_stop(self, request, pk=None, replica_id=None):
        deployment = self._changeable()
        replica = deployment.replicas.filter(pk=int(replica_id)).first()
        if replica is None:
            raise Http404
        return Response(ReplicaSerializer(replica_stop(replica=replica)).data)
