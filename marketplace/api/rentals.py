"""REST API for renters: instances (rentals), SSH keys, committed images. Offers and quotes
are in ``offers.py``."""

from __future__ import annotations

import functools

import django_filters
from django import forms
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from marketplace.api.base import TeamScopedViewSet
from marketplace.api.fields import (
    DOLLARS_SCHEMA,
    DollarsField,
    clamped_whole,
    dollars,
)
from marketplace.api.permissions import api_team
from marketplace.api.rent_requests import (
    LAUNCH_MODE_CHOICE,
    ExtendSerializer,
    GpuShareSerializer,
    MountSerializer,
    RentSerializer,
    rent_request,
)
from marketplace.models import CommittedImage, Rental, SshKey
from marketplace.rentals.actions import (
    instance_label,
    rental_continue,
    rental_destroy_request,
    rental_exec,
    rental_pause,
    rental_restart,
    rental_start,
    rental_stop_request,
)
from marketplace.rentals.bids import rental_bid_change
from marketplace.rentals.clocks import ENDED_STATES
from marketplace.rentals.extending import rental_extend
from marketplace.rentals.renting import Rented, rental_create
from marketplace.rentals.versions import (
    rental_commit,
    rental_new_version,
    rental_rollback,
    rental_version_delete,
)
from marketplace.rentals.volume_mounts import MountRequest
from marketplace.selectors import instance_connection, instance_logs, rental_versions
from marketplace.services.ssh_keys import (
    instance_ssh_key_attach,
    instance_ssh_key_detach,
    ssh_key_add,
)
from marketplace.tenancy import team_object_or_404
from marketplace.url_ids import MAX_ID
from scheduler import services as scheduler
from scheduler.models import Instance, InstanceState, LaunchMode


class VersionPatchSerializer(serializers.Serializer):
    """The spec fields a new version may change; others are refused by name."""

    image = serializers.CharField(max_length=255, required=False)
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=4096, trim_whitespace=False),
        required=False,
    )
    entrypoint = serializers.CharField(max_length=255, allow_blank=True, required=False)
    args = serializers.ListField(
        child=serializers.CharField(max_length=4096, allow_blank=True, trim_whitespace=False),
        required=False,
        max_length=64,
    )
    launch_mode = serializers.ChoiceField(
        choices=LaunchMode.choices,
        required=False,
        error_messages={"invalid_choice": LAUNCH_MODE_CHOICE},
    )
    num_gpus = serializers.IntegerField(min_value=1, max_value=64, required=False)
    volumes = serializers.ListField(child=MountSerializer(), required=False, max_length=8)
    ports = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=65535), required=False, max_length=16
    )
    disk_gb = serializers.IntegerField(min_value=1, max_value=100_000, required=False)

    def validate(self, data):
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(
                dict.fromkeys(sorted(unknown), "Not a field of an instance's spec.")
            )
        if not data:
            raise serializers.ValidationError(
                "Give at least one of image, env, entrypoint, args, launch_mode, num_gpus, "
                "volumes, ports, disk_gb."
            )
        if "num_gpus" in data:
            data["gpu_count"] = data.pop("num_gpus")
        if "volumes" in data:
            data["volumes"] = [
                MountRequest(volume_id=mount["volume"], target=mount["target"])
                for mount in data["volumes"]
            ]
        return data


class RollbackSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, max_value=1_000_000)


class CommitSerializer(serializers.Serializer):
    repository = serializers.CharField(max_length=100)
    tag = serializers.CharField(max_length=128, default="latest")


class BidSerializer(serializers.Serializer):
    bid_price = DollarsField(help_text='The new bid in dollars per GPU-hour, like "0.40".')


class LabelSerializer(serializers.Serializer):
    label = serializers.CharField(max_length=100, allow_blank=True)


class InstanceSerializer(serializers.ModelSerializer):
    rental_id = serializers.IntegerField(source="rental.id", read_only=True)
    machine_id = serializers.IntegerField(read_only=True)
    ends_at = serializers.DateTimeField(source="rental.ends_at", read_only=True)
    dph_total = serializers.SerializerMethodField()
    gpus = serializers.SerializerMethodField()
    gpu_share = serializers.SerializerMethodField()
    connection = serializers.SerializerMethodField()
    disk_enforced = serializers.BooleanField(source="machine.disk_enforced", read_only=True)
    interruptible = serializers.BooleanField(source="rental.interruptible", read_only=True)
    bid_price = serializers.SerializerMethodField()
    interrupted_at = serializers.DateTimeField(source="rental.interrupted_at", read_only=True)

    class Meta:
        model = Instance
        fields = [
            "id", "uuid", "label", "state", "status_message", "progress", "machine_id", "rental_id",
            "gpu_count", "gpu_share", "gpus", "image", "launch_mode", "env", "disk_gb",
            "disk_enforced", "version", "dph_total", "interruptible", "bid_price",
            "interrupted_at", "created_at", "state_changed_at", "ends_at", "connection",
        ]  # fmt: skip

    @extend_schema_field({**DOLLARS_SCHEMA, "nullable": True})
    def get_bid_price(self, instance) -> str | None:
        """The bid per GPU-hour of an interruptible rental (None: on demand)."""
        rental = instance.rental
        return dollars(rental.price_per_gpu_hour) if rental.interruptible else None

    @extend_schema_field(GpuShareSerializer(allow_null=True))
    def get_gpu_share(self, instance) -> dict | None:
        if not instance.is_slice:
            return None
        return {"core_percent": instance.slice_core_percent, "memory_mb": instance.slice_memory_mb}

    @extend_schema_field(DOLLARS_SCHEMA)
    def get_dph_total(self, instance) -> str:
        rental = instance.rental
        return dollars(rental.price_per_gpu_hour * rental.gpu_count)

    def get_gpus(self, instance) -> list[str]:
        return scheduler.instance_gpu_uuids(instance)

    def get_connection(self, instance) -> dict:
        return instance_connection(instance)


class _RentedInstanceSerializer(InstanceSerializer):
    """A rent's answer but its GPUs and connection, which ``rented_data`` takes from what the
    rent wrote."""

    class Meta(InstanceSerializer.Meta):
        fields = [f for f in InstanceSerializer.Meta.fields if f not in ("gpus", "connection")]


@functools.cache
def _instance_shape() -> InstanceSerializer:
    return InstanceSerializer()


def instance_data(instance: Instance) -> dict:
    """``InstanceSerializer(instance).data``, through one serializer per process: a
    ModelSerializer builds and binds its fields from the model each time it is made, many
    times the cost of using them (figures in docs/benchmarks.md). Its fields keep no state
    between uses."""
    return _instance_shape().to_representation(instance)


@functools.cache
def _rented_shape() -> _RentedInstanceSerializer:
    return _RentedInstanceSerializer()


def rented_data(rented: Rented) -> dict:
    """A rent's answer, ``instance_data``'s shape, from what the rent wrote (the instance with
    its rental and machine, its GPUs and ports, all in memory), not read back: the rows are
    exactly these."""
    rental = rented.rental
    instance = rental.instance
    instance.rental, instance.machine = rental, rental.machine
    data = _rented_shape().to_representation(instance)
    data["gpus"] = rented.gpu_uuids
    data["connection"] = instance_connection(instance, ports=rented.ports)
    return {name: data[name] for name in InstanceSerializer.Meta.fields}


MAX_COMMAND_LENGTH = 4096


class ExecSerializer(serializers.Serializer):
    command = serializers.CharField(
        max_length=MAX_COMMAND_LENGTH,
        help_text="Run with sh -c in the container.",
        error_messages={
            "required": "Type a command first.",
            "blank": "Type a command first.",
            "max_length": f"The command is longer than {MAX_COMMAND_LENGTH} characters.",
        },
    )


class AttachKeySerializer(serializers.Serializer):
    public_key = serializers.CharField(max_length=16384, help_text="One OpenSSH public key line.")
    name = serializers.CharField(
        max_length=80, default="attached", help_text="Its name on the team, if it is new there."
    )


class IdFilter(django_filters.NumberFilter):
    field_class = forms.IntegerField


class InstanceFilter(django_filters.FilterSet):
    """``state``: one state, or ``ended`` (failed, expired, destroying or destroyed) or ``all``.
    Without it the list is every rental but the destroyed ones, as it always was."""

    state = django_filters.ChoiceFilter(
        choices=[
            *InstanceState.choices,
            ("ended", "Ended: failed, expired, destroying or destroyed"),
            ("all", "All, the destroyed ones included"),
        ],
        method="state_filter",
    )
    # A whole id, as the URLs take them: "1.5", "-1e300" or one past a bigint answer 400.
    machine_id = IdFilter(min_value=1, max_value=MAX_ID)

    class Meta:
        model = Instance
        fields = ["state", "machine_id"]

    def filter_queryset(self, queryset):
        if not self.form.cleaned_data.get("state"):
            queryset = queryset.exclude(state=InstanceState.DESTROYED)
        return super().filter_queryset(queryset)

    def state_filter(self, queryset, name, value):
        if value == "all":
            return queryset
        if value == "ended":
            return queryset.filter(state__in=ENDED_STATES)
        return queryset.filter(state=value)


class InstanceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """The team's rentals. POST rents an offer; DELETE destroys (container, data, settlement).
    The list keeps ended ones as history: ``?state=ended`` (or ``all``) lists the destroyed too."""

    base_queryset = Instance.objects.select_related("rental", "machine")
    serializer_class = InstanceSerializer
    audience = "renter"
    filterset_class = InstanceFilter

    def get_queryset(self):
        # Only the list shows destroyed rentals (when asked to); one by id, or an action on
        # one, answers 404 for them as before.
        queryset = super().get_queryset()
        if self.action in ("list", "retrieve"):  # they show each instance's GPUs and ports
            queryset = scheduler.with_live_holdings(queryset)
        if self.action == "list":
            return queryset
        return queryset.exclude(state=InstanceState.DESTROYED)

    @extend_schema(request=RentSerializer, responses={201: InstanceSerializer})
    def create(self, request):
        rented = rental_create(team=self.team, request=rent_request(request.data))
        return Response(rented_data(rented), status=status.HTTP_201_CREATED)

    def _as_now(self, instance: Instance) -> dict:
        """The instance as it is after an action (a worker may have moved it on already)."""
        current = Instance.objects.select_related("rental", "machine").get(pk=instance.pk)
        return instance_data(current)

    @extend_schema(responses={202: InstanceSerializer})
    def destroy(self, request, pk=None):
        """The rental ends now; the instance is destroying until its host confirms."""
        instance = self.get_object()
        rental_destroy_request(instance=instance)
        return Response(self._as_now(instance), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        """GPU time stops being charged now; the instance is stopping until its host confirms."""
        instance = self.get_object()
        rental_stop_request(instance=instance)
        return Response(self._as_now(instance), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        """Running again at once, or launching again (by a worker) if it had no container."""
        instance = self.get_object()
        rental_start(instance=instance)
        return Response(self._as_now(instance))

    def _by(self, request) -> str:
        return str(getattr(request.user, "username", "") or "")

    @extend_schema(request=VersionPatchSerializer, responses={202: InstanceSerializer})
    def partial_update(self, request, pk=None):
        """A new version with the changed spec: the current container stops (kept as the
        previous version) and a new one, ``<name>-<n>``, starts on the same GPUs."""
        params = VersionPatchSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        instance = self.get_object()
        rental_new_version(
            instance=instance, changes=dict(params.validated_data), by=self._by(request)
        )
        return Response(self._as_now(instance), status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def versions(self, request, pk=None):
        """Every version, oldest first: number, spec, when, by whom, state (the current one's
        is the instance's; earlier ones are stopped)."""
        instance = self.get_object()
        return Response(rental_versions(instance))

    @extend_schema(request=RollbackSerializer, responses={202: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        """A new version with an earlier version's spec."""
        params = RollbackSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        instance = self.get_object()
        rental_rollback(
            instance=instance, number=params.validated_data["version"], by=self._by(request)
        )
        return Response(self._as_now(instance), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={204: None})
    @action(
        detail=True,
        methods=["delete"],
        url_path=r"versions/(?P<number>[0-9]{1,7})",
        url_name="version",
    )
    def version(self, request, pk=None, number=None):
        """Remove an earlier version's stopped container and forget it."""
        rental_version_delete(instance=self.get_object(), number=int(number))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=CommitSerializer, responses={201: dict})
    @action(detail=True, methods=["post"])
    def commit(self, request, pk=None):
        """``docker commit`` the container as your team's private image on this machine:
        ``gpumkt-team-<team>/<repository>:<tag>``, which only your team's rentals on this
        machine may run."""
        params = CommitSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        image = rental_commit(
            instance=self.get_object(),
            repository=params.validated_data["repository"],
            tag=params.validated_data["tag"],
            by=self._by(request),
        )
        return Response(
            {"image": image.reference, "machine_id": image.machine_id, "version": image.version},
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(request=None, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Freeze the container (docker pause): its GPUs stay allocated and charged."""
        rental_pause(instance=self.get_object())
        return Response(self._as_now(self.get_object()))

    @extend_schema(request=None, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"], url_path="continue", url_name="continue")
    def continue_(self, request, pk=None):
        """Unfreeze a paused container (docker unpause)."""
        rental_continue(instance=self.get_object())
        return Response(self._as_now(self.get_object()))

    @extend_schema(request=None, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def restart(self, request, pk=None):
        """Restart the container in place: same GPUs, ports and files; its command runs again."""
        rental_restart(instance=self.get_object())
        return Response(self._as_now(self.get_object()))

    @extend_schema(request=BidSerializer, responses={200: InstanceSerializer})
    @action(detail=True, methods=["put"])
    def bid(self, request, pk=None):
        """Change an interruptible rental's bid from now on: a higher bid may win its GPUs
        back (or others'), a lower one may lose them to a waiting higher bid."""
        instance = self.get_object()
        params = BidSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        rental_bid_change(rental=instance.rental, bid=params.validated_data["bid_price"])
        return Response(self._as_now(instance))

    @extend_schema(request=LabelSerializer, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def label(self, request, pk=None):
        """Name the instance ("" removes the name); nothing on its host changes."""
        instance = self.get_object()
        params = LabelSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        instance_label(instance=instance, label=params.validated_data["label"])
        return Response(self._as_now(instance))

    @extend_schema(request=ExtendSerializer, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        instance = self.get_object()
        params = ExtendSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        rental_extend(rental=instance.rental, hours=params.validated_data["hours"])
        return Response(InstanceSerializer(self.get_object()).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "tail",
                int,
                description="How many of the last lines to show (default 200). Any whole "
                "number is taken: below 1 means 1 line (tail=-1 is the last line), above 5000 "
                "means 5000.",
            )
        ],
        responses={200: dict},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        instance = self.get_object()
        try:
            tail = clamped_whole(request.query_params.get("tail", 200), 1, 5000)
        except ValueError:
            raise serializers.ValidationError({"tail": "A whole number of lines."}) from None
        text, note = instance_logs(instance, tail=tail)
        return Response({"logs": text, "message": note})

    @extend_schema(request=AttachKeySerializer, responses={200: dict})
    @action(detail=True, methods=["post"], url_path="ssh-keys")
    def attach_ssh_key(self, request, pk=None):
        """Put an SSH key into the running SSH-mode instance now (the team keeps the key)."""
        instance = self.get_object()
        params = AttachKeySerializer(data=request.data)
        params.is_valid(raise_exception=True)
        key = instance_ssh_key_attach(instance=instance, **params.validated_data)
        return Response(SshKeySerializer(key).data)

    @extend_schema(request=None, responses={204: None})
    @action(
        detail=True, methods=["delete"], url_path=r"ssh-keys/(?P<key_id>[0-9]{1,18})",
        url_name="detach-ssh-key",
    )  # fmt: skip
    def detach_ssh_key(self, request, pk=None, key_id=None):
        """Take the team's SSH key out of the running SSH-mode instance."""
        instance = self.get_object()
        key = team_object_or_404(self.team, SshKey.objects.all(), pk=key_id)
        instance_ssh_key_detach(instance=instance, key=key)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=ExecSerializer, responses={200: dict})
    @action(detail=True, methods=["post"], url_path="exec")
    def exec_command(self, request, pk=None):
        instance = self.get_object()
        params = ExecSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        result = rental_exec(instance=instance, command=params.validated_data["command"])
        return Response({"exit_code": result.exit_code, "output": result.stdout + result.stderr})


class SshKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = SshKey
        fields = ["id", "name", "public_key", "fingerprint", "created_at"]
        read_only_fields = ["id", "fingerprint", "created_at"]


class SshKeyViewSet(
    mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin, TeamScopedViewSet
):
    """The team's SSH public keys, put into instances launched in SSH mode."""

    base_queryset = SshKey.objects.all()
    serializer_class = SshKeySerializer
    audience = "renter"

    def perform_create(self, serializer):
        serializer.instance = ssh_key_add(
            team=api_team(self.request),
            name=serializer.validated_data["name"],
            public_key=serializer.validated_data["public_key"],
        )


__all__ = ["Rental", "InstanceViewSet", "SshKeyViewSet"]


class CommittedImageSerializer(serializers.ModelSerializer):
    machine_id = serializers.IntegerField(read_only=True)

    class Meta:
        model = CommittedImage
        fields = [
            "id",
            "reference",
            "machine_id",
            "instance_id",
            "version",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class CommittedImageViewSet(mixins.ListModelMixin, TeamScopedViewSet):
    """The team's committed images (``POST /api/v1/instances/<id>/commit/``): each exists on
    one machine, where only the team's rentals may run it."""

    base_queryset = CommittedImage.objects.all()
    serializer_class = CommittedImageSerializer
    audience = "renter"
    filterset_fields = ["machine_id"]
