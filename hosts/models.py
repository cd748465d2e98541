"""Machines, their GPUs, listing terms, maintenance windows, events and heartbeats."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class MachineStatus(models.TextChoices):
    PENDING = "pending", "Connecting"
    AWAITING_CONFIRMATION = "awaiting_confirmation", "Confirm host key"
    ONLINE = "online", "Online"
    OFFLINE = "offline", "Offline"
    # SSH answers but the machine's Docker Engine does not: nothing can run there.
    DEGRADED = "degraded", "Docker not answering"
    KEY_MISMATCH = "key_mismatch", "Host key changed"
    ERROR = "error", "Error"


def in_service(status: str) -> bool:
    """Whether commands reach the machine and its rentals run (and are charged).

    Only an online machine is in service: offline (heartbeats missed), degraded (its Docker
    does not answer), a changed host key, an error (its probes keep failing) or a machine
    still being set up are all out of it.
    """
    return status == MachineStatus.ONLINE


class Machine(models.Model):
    """A provider's GPU machine, reached over SSH with a pinned host key.

    Its resources are cut into units: one GPU plus an even share of the CPU cores, RAM and
    disk (8 GPUs, 128 cores, 720 GB → 1 GPU + 16 cores + 90 GB per unit).
    """

    team = models.ForeignKey("marketplace.Team", on_delete=models.CASCADE, related_name="machines")
    name = models.CharField(max_length=80)
    address = models.CharField(max_length=255)
    port = models.PositiveIntegerField(default=22)
    ssh_user = models.CharField(max_length=32, default="root")
    host_key_type = models.CharField(max_length=40, blank=True)
    host_key = models.TextField(blank=True, help_text="base64 of the pinned host key")
    host_key_fingerprint = models.CharField(max_length=80, blank=True)
    # The key the machine presented before the provider confirmed it (not trusted yet).
    offered_key_type = models.CharField(max_length=40, blank=True)
    offered_key = models.TextField(blank=True)
    offered_key_fingerprint = models.CharField(max_length=80, blank=True)
    status = models.CharField(
        max_length=24, choices=MachineStatus.choices, default=MachineStatus.PENDING
    )
    status_detail = models.CharField(max_length=500, blank=True)
    listed = models.BooleanField(default=False)
    price_per_gpu_hour = models.BigIntegerField(default=0, help_text="micro-dollars")
    storage_price_per_gb_month = models.BigIntegerField(default=0, help_text="micro-dollars")
    min_gpus = models.PositiveSmallIntegerField(default=1)
    # The lowest bid per GPU-hour the provider accepts for interruptible rentals; None: the
    # machine takes no bids (a provider opts in, so no GPU goes for less than it chose).
    min_bid_price_per_gpu_hour = models.BigIntegerField(
        null=True, blank=True, help_text="micro-dollars"
    )
    end_date = models.DateTimeField(null=True, blank=True)
    location = models.CharField(max_length=64, blank=True)
    cpu_cores = models.PositiveIntegerField(default=0)
    ram_mb = models.PositiveBigIntegerField(default=0)
    disk_free_gb = models.PositiveBigIntegerField(default=0)
    docker_version = models.CharField(max_length=40, blank=True)
    nvidia_runtime = models.BooleanField(default=False)
    # Whether Docker here can cap a container's writable layer (``--storage-opt size=``): its
    # btrfs storage driver, or overlay2 over XFS mounted with project quotas. Read by the probe.
    disk_enforced = models.BooleanField(default=False)
    driver_version = models.CharField(max_length=40, blank=True)
    cuda_version = models.CharField(max_length=16, blank=True)
    os_name = models.CharField(max_length=120, blank=True)
    # Host ports for published container ports. The default stays below Linux's ephemeral
    # range (32768-60999), where outgoing connections take local ports.
    port_range_start = models.PositiveIntegerField(default=20000)
    port_range_end = models.PositiveIntegerField(default=20999)
    # Renters' images come from public registries only: a registry on loopback, link-local or
    # private addresses would make this machine's Docker speak to the provider's own network.
    # A provider who runs a registry on its LAN for its renters turns this on.
    allow_private_registries = models.BooleanField(
        default=False,
        help_text="Let renters pull images from registries on this machine's own network "
        "(loopback, link-local and private addresses).",
    )
    # The provider's own private ranges (IPv4 CIDRs) its rentals may not reach, besides the
    # host's own addresses and link-local ones, which are always refused (hosts.runtime.firewall).
    blocked_ranges = models.JSONField(
        default=list,
        blank=True,
        help_text="Private address ranges of your network that rentals may not reach, "
        "like 10.0.0.0/8 (the host itself and 169.254.0.0/16 are always refused).",
    )
    # Whether the last probe found the tenant firewall in place (None: never checked), and
    # what it found.
    tenant_firewall = models.BooleanField(null=True)
    # The ranges this machine's last good probe refused on its host: one the provider drops
    # later is deleted by this machine's next probe. A rule is never deleted because this
    # machine does not want it: the host's iptables may hold another machine's (a host shared
    # by simulated machines; another installation).
    firewall_ranges = models.JSONField(default=list, blank=True)
    tenant_firewall_detail = models.CharField(max_length=300, blank=True)
    # GPU sharing (fractional GPUs): the provider lets renters take slices of a card (compute
    # percent and memory), enforced on the host by CUDA MPS; the probe says whether MPS is there.
    mps_available = models.BooleanField(default=False)
    sharing_enabled = models.BooleanField(default=False)
    sharing_min_core_percent = models.PositiveSmallIntegerField(
        default=10, help_text="The smallest slice of a card's compute a renter may take."
    )
    reliability = models.FloatField(default=1.0)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    heartbeat_misses = models.PositiveSmallIntegerField(default=0)
    # The last probe that read everything; failed re-probes keep these figures.
    probed_at = models.DateTimeField(null=True, blank=True)
    probe_attempted_at = models.DateTimeField(null=True, blank=True)
    # Failed probes in a row (a tool failing, not an unreachable machine: heartbeats judge
    # reachability) and what the last one could not read.
    probe_failures = models.PositiveSmallIntegerField(default=0)
    probe_problems = models.JSONField(default=list, blank=True)
    # Verified: it passed its last self-test and benchmark, is reliable enough and measures
    # near its GPU model's typical figures (hosts.verification); an operator may revoke or
    # restore it by hand (``verification_by_operator``), which the next automatic run keeps.
    verified = models.BooleanField(
        default=False, help_text="Set by verification runs, or by an operator with a reason."
    )
    verified_changed_at = models.DateTimeField(null=True, blank=True)
    verification_detail = models.CharField(max_length=500, blank=True)
    # "auto" (decided by runs) or "revoked" / "restored" by an operator, who then owns it.
    verification_override = models.CharField(max_length=12, default="auto")
    verification_due_at = models.DateTimeField(null=True, blank=True)
    # The last benchmark's figures, per GPU where they are a GPU's, for offers and search.
    bench_at = models.DateTimeField(null=True, blank=True)
    bench_gpu_simulated = models.BooleanField(default=False)
    compute_cap = models.PositiveSmallIntegerField(default=0, help_text="e.g. 890 for 8.9")
    tflops_per_gpu = models.FloatField(default=0, help_text="FP32 TFLOPS of one GPU")
    gpu_mem_bw = models.FloatField(default=0, help_text="GB/s of one GPU's memory")
    dlperf_per_gpu = models.FloatField(default=0)
    disk_write_mbps = models.FloatField(default=0, help_text="MB/s inside a rental's container")
    disk_read_mbps = models.FloatField(default=0, help_text="MB/s inside a rental's container")
    inet_up = models.FloatField(default=0, help_text="Mbit/s host → platform")
    inet_down = models.FloatField(default=0, help_text="Mbit/s platform → host")
    docker_start_ms = models.PositiveIntegerField(default=0)
    # The last self-test: a probe plus a real container whose limits are read back.
    self_test_at = models.DateTimeField(null=True, blank=True)
    self_test_passed = models.BooleanField(null=True)
    self_test_report = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            # Per team: a team that names another team's machine only makes a record it can
            # never log in with (the machine authorized the other team's key), and must not
            # lock the real owner out by naming it first.
            models.UniqueConstraint(
                fields=["team", "address", "port"], name="machine_unique_team_address_port"
            ),
            models.CheckConstraint(
                condition=Q(port_range_end__gte=models.F("port_range_start")),
                name="machine_port_range_ordered",
            ),
            models.CheckConstraint(
                condition=Q(price_per_gpu_hour__gte=0) & Q(storage_price_per_gb_month__gte=0),
                name="machine_prices_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(min_bid_price_per_gpu_hour__gt=0)
                | Q(min_bid_price_per_gpu_hour__isnull=True),
                name="machine_min_bid_positive",
            ),
            models.CheckConstraint(
                condition=Q(sharing_min_core_percent__gte=1, sharing_min_core_percent__lte=100),
                name="machine_sharing_min_core_percent_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name or f"{self.ssh_user}@{self.address}:{self.port}"

    @property
    def gpu_count(self) -> int:
        counted = getattr(self, "present_gpu_count", None)  # set by a query that counted them
        if counted is not None:
            return counted
        if "gpus" in getattr(self, "_prefetched_objects_cache", {}):  # lists prefetch them
            return sum(gpu.present for gpu in self.gpus.all())
        return self.gpus.filter(present=True).count()

    def _units(self) -> int:
        return max(self.gpu_count, 1)

    @property
    def unit_cpus(self) -> float:
        return round(self.cpu_cores / self._units(), 2)

    @property
    def unit_memory_mb(self) -> int:
        return int(self.ram_mb // self._units())

    @property
    def unit_disk_gb(self) -> int:
        return int(self.disk_free_gb // self._units())

    @property
    def unit_shm_mb(self) -> int:
        """Shared memory per unit: half the unit's RAM, at most 64 GB."""
        return min(self.unit_memory_mb // 2, 64 * 1024)


class Gpu(models.Model):
    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80)
    name = models.CharField(max_length=120)
    memory_mib = models.PositiveIntegerField()
    present = models.BooleanField(default=True)

    class Meta:
        ordering = ["machine", "index"]
        constraints = [
            models.UniqueConstraint(fields=["machine", "uuid"], name="gpu_unique_uuid_per_machine")
        ]

    def __str__(self) -> str:
        return f"GPU {self.index} ({self.name})"


class MaintenanceWindow(models.Model):
    machine = models.ForeignKey(
        Machine, on_delete=models.CASCADE, related_name="maintenance_windows"
    )
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["starts_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ends_at__gt=models.F("starts_at")), name="maintenance_ends_after_start"
            )
        ]

    def __str__(self) -> str:
        return f"maintenance {self.starts_at:%Y-%m-%d %H:%M}–{self.ends_at:%H:%M}"


class MachineEvent(models.Model):
    """What happened to a machine, newest first on its page (status changes, probes, terms…)."""

    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=40)
    message = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class HeartbeatSample(models.Model):
    """One heartbeat attempt; the reliability score is the share of successes in a window."""

    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="heartbeats")
    ok = models.BooleanField()
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    # Occupancy at that moment, for the utilization chart (hosts cannot ask the scheduler
    # later: the occupancy registry only knows the present).
    gpus_total = models.PositiveSmallIntegerField(default=0)
    gpus_rented = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["machine", "created_at"], name="heartbeat_machine_time")]

    def __str__(self) -> str:
        return f"{'ok' if self.ok else 'miss'} at {self.created_at:%H:%M:%S}"


class BenchmarkRun(models.Model):
    """One benchmark of a machine: every figure it measured, when, and whether it passed.

    GPU figures come from the benchmark image run on the machine's GPUs; ``gpu_simulated``
    marks a run whose GPUs are stand-ins (the simulated hosts): their figures are the GPU
    model's typical ones, not measurements. Everything else is always measured.
    """

    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="benchmarks")
    measured_at = models.DateTimeField(db_index=True)
    passed = models.BooleanField()
    reason = models.CharField(max_length=500, blank=True)
    gpu_simulated = models.BooleanField(default=False)
    gpu_count = models.PositiveSmallIntegerField(default=0)
    compute_cap = models.PositiveSmallIntegerField(default=0)
    tflops_per_gpu = models.FloatField(null=True, blank=True)
    fp16_tflops_per_gpu = models.FloatField(null=True, blank=True)
    gpu_mem_bw = models.FloatField(null=True, blank=True)
    disk_write_mbps = models.FloatField(null=True, blank=True)
    disk_read_mbps = models.FloatField(null=True, blank=True)
    inet_up = models.FloatField(null=True, blank=True)
    inet_down = models.FloatField(null=True, blank=True)
    docker_start_ms = models.PositiveIntegerField(null=True, blank=True)
    dlperf_per_gpu = models.FloatField(null=True, blank=True)
    # Each step as {"name", "ok", "detail"} (like the self-test's checks), GPUs one by one.
    steps = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-measured_at", "-pk"]
        indexes = [models.Index(fields=["machine", "measured_at"], name="benchmark_machine_time")]

    def __str__(self) -> str:
        return f"benchmark {'passed' if self.passed else 'failed'} at {self.measured_at:%Y-%m-%d %H:%M}"


class ReliabilityRecord(models.Model):
    """A machine's reliability as computed at a moment: its history, drawn on its page."""

    machine = models.ForeignKey(
        Machine, on_delete=models.CASCADE, related_name="reliability_history"
    )
    recorded_at = models.DateTimeField(db_index=True)
    reliability = models.FloatField()
    rented_seconds = models.PositiveBigIntegerField(default=0)
    runnable_seconds = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-recorded_at"]
        indexes = [models.Index(fields=["machine", "recorded_at"], name="reliability_machine_time")]

    def __str__(self) -> str:
        return f"{self.reliability:.1%} at {self.recorded_at:%Y-%m-%d %H:%M}"
