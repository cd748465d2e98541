"""REST API for host providers: machines, their key confirmation, probing, terms and listing,
the platform's SSH key, heartbeat/utilization history and earnings per machine."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from hosts import services, tasks
from hosts.keys import public_key_fingerprint, team_public_key
from hosts.models import Gpu, Machine, MachineEvent, MaintenanceWindow
from hosts.selectors import GPU_STATES, gpu_occupancy, hourly_history
from marketplace.api.base import TeamScopedViewSet
from marketplace.api.fields import DollarsField
from marketplace.fleet import EARNINGS_DAYS, machine_earnings_by_day
from marketplace.host_usage import machine_gpu_usage, machine_port_usage
from marketplace.models import Role
from scheduler import services as scheduler


class GpuSerializer(serializers.ModelSerializer):
    state = serializers.SerializerMethodField(
        help_text="free, rented, offline (the machine is out of service) or missing (no "
        "longer reported by nvidia-smi)"
    )

    class Meta:
        model = Gpu
        fields = ["index", "uuid", "name", "memory_mib", "present", "state"]

    @extend_schema_field(serializers.ChoiceField(choices=GPU_STATES))
    def get_state(self, gpu) -> str:
        return self.context["gpu_states"][gpu.pk]


class UnitSerializer(serializers.Serializer):
    """One unit of the machine: 1 GPU and an even share of its cores, RAM and disk."""

    gpus = serializers.IntegerField()
    cpus = serializers.FloatField()
    memory_mb = serializers.IntegerField()
    disk_gb = serializers.IntegerField()
    shm_mb = serializers.IntegerField()


class MachineSerializer(serializers.ModelSerializer):
    """A machine; pass ``context={"occupancy": gpu_occupancy(machines)}`` when serializing
    many, or each machine asks for its own GPUs' states."""

    gpus = serializers.SerializerMethodField()
    unit = serializers.SerializerMethodField()
    price_per_gpu_hour = DollarsField(read_only=True, help_text="Dollars per GPU-hour.")
    storage_price_per_gb_month = DollarsField(read_only=True, help_text="Dollars per GB-month.")
    min_bid_price_per_gpu_hour = DollarsField(
        read_only=True, allow_null=True, help_text="Lowest bid per GPU-hour; null: no bids."
    )

    class Meta:
        model = Machine
        fields = [
            "id", "name", "address", "port", "ssh_user", "status", "status_detail",
            "host_key_fingerprint", "offered_key_fingerprint", "listed", "price_per_gpu_hour",
            "storage_price_per_gb_month", "min_bid_price_per_gpu_hour", "min_gpus", "end_date",
            "location", "cpu_cores", "ram_mb", "disk_free_gb", "docker_version", "nvidia_runtime", "driver_version", "cuda_version",
            "os_name", "port_range_start", "port_range_end", "reliability", "last_heartbeat_at",
            "verified", "verification_detail", "verified_changed_at", "bench_at",
            "bench_gpu_simulated", "compute_cap", "tflops_per_gpu", "gpu_mem_bw",
            "dlperf_per_gpu", "disk_write_mbps", "disk_read_mbps", "inet_up", "inet_down",
            "docker_start_ms", "probed_at", "probe_failures", "probe_problems", "self_test_at",
            "self_test_passed", "self_test_report", "mps_available", "sharing_enabled",
            "sharing_min_core_percent", "gpus", "unit", "created_at",
        ]  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(GpuSerializer(many=True))
    def get_gpus(self, machine) -> list:
        occupancy = self.context.get("occupancy")
        if occupancy is None or machine.pk not in occupancy:
            occupancy = gpu_occupancy([machine])
        cells = occupancy[machine.pk]
        states = {gpu.pk: state for gpu, state in cells}
        return GpuSerializer(
            [gpu for gpu, _ in cells], many=True, context={"gpu_states": states}
        ).data

    @extend_schema_field(UnitSerializer)
    def get_unit(self, machine) -> dict:
        return {
            "gpus": 1,
            "cpus": machine.unit_cpus,
            "memory_mb": machine.unit_memory_mb,
            "disk_gb": machine.unit_disk_gb,
            "shm_mb": machine.unit_shm_mb,
        }


class PlatformKeySerializer(serializers.Serializer):
    public_key = serializers.CharField(
        help_text="Your team's platform SSH key: add this line to ~/.ssh/authorized_keys of "
        "the machine's SSH user before registering the machine. Each team has its own."
    )
    fingerprint = serializers.CharField(help_text="SHA256 fingerprint, as ssh-keygen -lf prints")


class HistoryPointSerializer(serializers.Serializer):
    hour = serializers.DateTimeField(help_text="Start of the hour (UTC)")
    answered = serializers.FloatField(help_text="Share of heartbeats answered, 0..1")
    samples = serializers.IntegerField(help_text="Heartbeats sent in the hour")
    utilization = serializers.FloatField(help_text="Rented GPUs ÷ present GPUs, 0..1")
    gpus = serializers.IntegerField(help_text="Present GPUs at the hour's last heartbeat")


class HistoryQuerySerializer(serializers.Serializer):
    hours = serializers.IntegerField(min_value=1, max_value=168, default=24)


class EarningsDaySerializer(serializers.Serializer):
    day = serializers.DateField(source="key")
    gross = DollarsField(help_text="Dollars renters were charged.")
    fee = DollarsField(help_text="Dollars of platform fee within gross.")
    net = DollarsField(help_text="Dollars earned (gross − fee).")


class EarningsQuerySerializer(serializers.Serializer):
    days = serializers.IntegerField(min_value=1, max_value=366, default=EARNINGS_DAYS)


class MachineEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = MachineEvent
        fields = ["id", "kind", "message", "created_at"]
        read_only_fields = fields


class MaintenanceWindowSerializer(serializers.ModelSerializer):
    class Meta:
        model = MaintenanceWindow
        fields = ["id", "starts_at", "ends_at", "note"]
        read_only_fields = ["id"]
        extra_kwargs = {"note": {"required": False, "default": ""}}


class MachineRegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80, required=False, default="")
    address = serializers.CharField(max_length=255)
    port = serializers.IntegerField(min_value=1, max_value=65535, default=22)
    ssh_user = serializers.CharField(max_length=32, default="root")


class ConfirmSerializer(serializers.Serializer):
    fingerprint = serializers.CharField(max_length=80)


class TermsSerializer(serializers.Serializer):
    price_per_gpu_hour = DollarsField(help_text='Dollars per GPU-hour, like "1.45".')
    storage_price_per_gb_month = DollarsField(help_text='Dollars per GB-month, like "0.10".')
    min_gpus = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    end_date = serializers.DateTimeField(required=False, allow_null=True, default=None)
    location = serializers.CharField(max_length=64, allow_blank=True, default="")
    port_range_start = serializers.IntegerField(min_value=1024, max_value=65535, required=False)
    port_range_end = serializers.IntegerField(min_value=1024, max_value=65535, required=False)
    min_bid_price_per_gpu_hour = DollarsField(
        required=False,
        allow_null=True,
        help_text="The lowest bid per GPU-hour taken for interruptible rentals; null: the "
        "machine takes no bids; left out: unchanged.",
    )


class ListingSerializer(serializers.Serializer):
    listed = serializers.BooleanField()


class SharingSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(
        help_text="Let renters take slices of this machine's cards (needs CUDA MPS on the host)."
    )
    min_core_percent = serializers.IntegerField(
        min_value=1,
        max_value=100,
        default=10,
        help_text="The smallest share of a card's compute a renter may take, in percent.",
    )


class MachineViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TeamScopedViewSet):
    """The team's machines. POST registers one; the platform then reads its host key."""

    base_queryset = Machine.objects.prefetch_related("gpus")
    serializer_class = MachineSerializer
    audience = "provider"
    required_role = Role.ADMIN
    filterset_fields = ["status", "listed"]
    lookup_value_regex = "[0-9]+"

    def list(self, request):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        serializer = MachineSerializer(page, many=True, context={"occupancy": gpu_occupancy(page)})
        return self.get_paginated_response(serializer.data)

    @extend_schema(request=None, responses=PlatformKeySerializer)
    @action(detail=False, methods=["get"], url_path="platform-key")
    def platform_key(self, request):
        """The public SSH key to put in a machine's ``authorized_keys`` before registering
        it. Each team has its own: the platform logs in to a team's machines only with the
        team's key, so no other team can connect (and list) a machine that authorized it."""
        public_key = team_public_key(self.team.pk)
        return Response(
            {"public_key": public_key, "fingerprint": public_key_fingerprint(public_key)}
        )

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def gpus(self, request, pk=None):
        """Each present GPU: free, or rented (with the instance when it is the team's own;
        another team's rental shows only as rented), and its utilization read now."""
        machine = self.get_object()
        return Response(machine_gpu_usage(machine, viewer_team_id=self.team.pk))

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def ports(self, request, pk=None):
        """The host port range for published container ports: used (by which rental, as
        for GPUs) and free."""
        machine = self.get_object()
        return Response(machine_port_usage(machine, viewer_team_id=self.team.pk))

    @extend_schema(parameters=[HistoryQuerySerializer], responses=HistoryPointSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def history(self, request, pk=None):
        """Per hour, oldest first: heartbeats answered and GPU utilization (the machine
        page's uptime and utilization charts)."""
        machine = self.get_object()
        params = HistoryQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        points = hourly_history(machine, hours=params.validated_data["hours"])
        return Response(HistoryPointSerializer(points, many=True).data)

    @extend_schema(parameters=[EarningsQuerySerializer], responses=EarningsDaySerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def earnings(self, request, pk=None):
        """Per day, oldest first, days without charges included: what renters were charged
        on this machine, the platform fee and the net earnings (the machine page's chart)."""
        machine = self.get_object()
        params = EarningsQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        rows = machine_earnings_by_day(self.team, machine, days=params.validated_data["days"])
        return Response(EarningsDaySerializer(rows, many=True).data)

    @extend_schema(request=MachineRegisterSerializer, responses={201: MachineSerializer})
    def create(self, request):
        params = MachineRegisterSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        machine = services.machine_register(team_id=self.team.pk, **params.validated_data)
        transaction.on_commit(lambda: tasks.machine_connect.delay(machine.pk))
        return Response(MachineSerializer(machine).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ConfirmSerializer, responses=MachineSerializer)
    @action(detail=True, methods=["post"])
    def confirm(self, request, pk=None):
        machine = self.get_object()
        params = ConfirmSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        services.machine_confirm_host_key(
            machine_id=machine.pk, fingerprint=params.validated_data["fingerprint"]
        )
        transaction.on_commit(lambda: tasks.machine_probe.delay(machine.pk))
        return Response(MachineSerializer(self.get_object()).data)

    @extend_schema(request=None, responses={202: MachineSerializer})
    @action(detail=True, methods=["post"])
    def probe(self, request, pk=None):
        machine = self.get_object()
        transaction.on_commit(lambda: tasks.machine_probe.delay(machine.pk))
        return Response(MachineSerializer(machine).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=TermsSerializer, responses=MachineSerializer)
    @action(detail=True, methods=["put"])
    def terms(self, request, pk=None):
        machine = self.get_object()
        params = TermsSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        services.machine_set_terms(machine_id=machine.pk, **params.validated_data)
        return Response(MachineSerializer(self.get_object()).data)

    @extend_schema(request=ListingSerializer, responses=MachineSerializer)
    @action(detail=True, methods=["put"])
    def listing(self, request, pk=None):
        machine = self.get_object()
        params = ListingSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        services.machine_set_listed(machine_id=machine.pk, listed=params.validated_data["listed"])
        return Response(MachineSerializer(self.get_object()).data)

    @extend_schema(request=SharingSerializer, responses=MachineSerializer)
    @action(detail=True, methods=["put"])
    def sharing(self, request, pk=None):
        """Turn GPU sharing on or off: renters may then rent slices of a card (compute percent
        and memory) on its cards that no whole-GPU rental holds. Refused, saying why, on a
        host without CUDA MPS, and off while slices are rented."""
        machine = self.get_object()
        params = SharingSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        scheduler.machine_sharing_set(
            machine_id=machine.pk,
            enabled=params.validated_data["enabled"],
            min_core_percent=params.validated_data["min_core_percent"],
        )
        transaction.on_commit(lambda: tasks.machine_mps_follow.delay(machine.pk))
        return Response(MachineSerializer(self.get_object()).data)

    @extend_schema(request=None, responses={202: MachineSerializer})
    @action(detail=True, methods=["post"])
    def reconnect(self, request, pk=None):
        """Read the host key the machine presents again (after a key change, say)."""
        machine = self.get_object()
        transaction.on_commit(lambda: tasks.machine_connect.delay(machine.pk))
        return Response(MachineSerializer(machine).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: MachineSerializer})
    @action(detail=True, methods=["post"], url_path="self-test")
    def self_test(self, request, pk=None):
        """Probe, run a test container and check its limits; the result lands on the machine
        (``self_test_passed``, ``self_test_report``)."""
        machine = self.get_object()
        transaction.on_commit(lambda: tasks.machine_self_test.delay(machine.pk))
        return Response(MachineSerializer(machine).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses=MachineEventSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def events(self, request, pk=None):
        machine = self.get_object()
        page = self.paginate_queryset(machine.events.all())
        return self.get_paginated_response(MachineEventSerializer(page, many=True).data)

    @extend_schema(methods=["get"], request=None, responses=MaintenanceWindowSerializer(many=True))
    @extend_schema(
        methods=["post"],
        request=MaintenanceWindowSerializer,
        responses={201: MaintenanceWindowSerializer},
    )
    @action(detail=True, methods=["get", "post"], pagination_class=None, filter_backends=[])
    def maintenance(self, request, pk=None):
        """Maintenance windows: no new rental may overlap one."""
        machine = self.get_object()
        if request.method == "GET":
            windows = machine.maintenance_windows.all()
            return Response(MaintenanceWindowSerializer(windows, many=True).data)
        params = MaintenanceWindowSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        window = services.maintenance_window_add(machine_id=machine.pk, **params.validated_data)
        return Response(MaintenanceWindowSerializer(window).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    @action(
        detail=True,
        methods=["delete"],
        url_path=r"maintenance/(?P<window_id>[0-9]+)",
        url_name="maintenance-cancel",
    )
    def maintenance_cancel(self, request, pk=None, window_id=None):
        machine = self.get_object()
        services.maintenance_window_remove(machine_id=machine.pk, window_id=int(window_id))
        return Response(status=status.HTTP_204_NO_CONTENT)

    def destroy(self, request, pk=None):
        """Remove a machine that was never rented (otherwise 400: unlist it instead)."""
        machine = self.get_object()
        services.machine_remove(machine_id=machine.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


router = SimpleRouter()
router.register("machines", MachineViewSet, basename="api-machine")
urlpatterns: list = [*router.urls]
