"""Instances (containers), their state machine, and the allocations of GPU units, GPU slices
and host ports.

The database, not only the code, keeps a GPU and a host port to at most one live allocation:
partial unique constraints over the rows that are not yet released. A card's live slices never
sum past 100 % of its compute or its memory, and a card is whole-rented or sliced, never both:
triggers refuse the row that would break either (migration 0007_gpu_slices), each under a lock on the card.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q


class InstanceState(models.TextChoices):
    LAUNCHING = "launching", "Launching"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    EXITED = "exited", "Exited"
    # Its host cannot say (SSH or Docker does not answer): the container may run or not.
    UNKNOWN = "unknown", "Unknown"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"
    DESTROYING = "destroying", "Destroying"
    DESTROYED = "destroyed", "Destroyed"


S = InstanceState
# Which state may follow which. Every change goes through scheduler.services.instance_transition.
# A failed instance has ended (its launch failed, or its container vanished): it can only be
# cleaned up. Stopping and destroying are asked for at once and carried out by a worker, which
# moves the instance on once the host has confirmed.
TRANSITIONS: dict[str, set[str]] = {
    S.LAUNCHING: {S.RUNNING, S.FAILED, S.STOPPING, S.EXPIRED, S.DESTROYING},
    # Running or exited → launching: a new version of its spec (PATCH) starts on its GPUs.
    S.RUNNING: {
        S.PAUSED,
        S.EXITED,
        S.LAUNCHING,
        S.STOPPING,
        S.FAILED,
        S.EXPIRED,
        S.DESTROYING,
        S.UNKNOWN,
    },
    # Paused: the container's processes are frozen (docker pause) and it keeps its GPUs, which
    # stay charged: nobody else can use them meanwhile.
    S.PAUSED: {S.RUNNING, S.EXITED, S.STOPPING, S.FAILED, S.EXPIRED, S.DESTROYING, S.UNKNOWN},
    # Unknown: its machine went out of service (heartbeats missed, Docker not answering). It
    # keeps its GPUs, is not charged, and follows its container again once the host answers.
    S.UNKNOWN: {S.RUNNING, S.PAUSED, S.EXITED, S.STOPPING, S.FAILED, S.EXPIRED, S.DESTROYING},
    S.EXITED: {S.RUNNING, S.LAUNCHING, S.STOPPING, S.FAILED, S.EXPIRED, S.DESTROYING},
    S.STOPPING: {S.STOPPED, S.EXPIRED, S.DESTROYING},
    S.STOPPED: {S.LAUNCHING, S.RUNNING, S.EXPIRED, S.DESTROYING},
    S.FAILED: {S.DESTROYING},
    S.EXPIRED: {S.DESTROYING},
    S.DESTROYING: {S.DESTROYED},
    S.DESTROYED: set(),
}

# States in which the instance holds its GPUs. Stopping and destroying keep them until the host
# confirms the container stopped: until then it may still run on them.
GPU_HOLDING_STATES = {
    S.LAUNCHING,
    S.RUNNING,
    S.PAUSED,
    S.EXITED,
    S.UNKNOWN,
    S.STOPPING,
    S.DESTROYING,
}

# States whose work a worker carries out under a lease (scheduler.work): a worker that dies
# mid-way loses its lease, and the work sweep hands the work to another.
WORK_STATES = {S.LAUNCHING, S.STOPPING, S.DESTROYING}


class LaunchMode(models.TextChoices):
    ENTRYPOINT = "entrypoint", "Entrypoint / args"
    SSH = "ssh", "SSH"
    JUPYTER = "jupyter", "Jupyter"


class Instance(models.Model):
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    team = models.ForeignKey("marketplace.Team", on_delete=models.CASCADE, related_name="instances")
    machine = models.ForeignKey("hosts.Machine", on_delete=models.PROTECT, related_name="instances")
    state = models.CharField(
        max_length=16, choices=InstanceState.choices, default=InstanceState.LAUNCHING
    )
    status_message = models.CharField(max_length=500, blank=True)
    progress = models.PositiveSmallIntegerField(default=0, help_text="Launch progress, 0-100.")
    gpu_count = models.PositiveSmallIntegerField()
    image = models.CharField(max_length=255)
    launch_mode = models.CharField(
        max_length=16, choices=LaunchMode.choices, default=LaunchMode.ENTRYPOINT
    )
    entrypoint = models.CharField(max_length=255, blank=True)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    disk_gb = models.PositiveIntegerField(default=10)
    # A slice of one card instead of whole GPUs (then gpu_count is 1): compute percent and MB of
    # the card's memory, enforced on the host by CUDA MPS. Both null for whole GPUs.
    slice_core_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    slice_memory_mb = models.PositiveIntegerField(null=True, blank=True)
    # The volumes its container mounts, as [volume's name on the host, path inside]: the
    # scheduler builds the container from this alone (the volumes themselves are marketplace's).
    volumes = models.JSONField(default=list, blank=True)
    container_id = models.CharField(max_length=80, blank=True)
    # The container's exit status, read when it is seen exited (null until then, and for
    # containers that vanished or were stopped by us): jobs count an exit 0 as done.
    exit_code = models.SmallIntegerField(null=True, blank=True)
    # The last lines its container wrote, read just before a destroy removed the container:
    # what an ended rental's page can still show.
    last_log = models.TextField(blank=True, default="")
    label = models.CharField(
        max_length=100, blank=True, default="", help_text="The renter's own name for it."
    )
    # Each change of its spec (PATCH) runs a new container, version n; earlier ones are kept,
    # stopped, as InstanceVersion rows.
    version = models.PositiveIntegerField(default=1)
    jupyter_token = models.CharField(max_length=64, blank=True)
    registry_credential = models.JSONField(
        default=dict, blank=True, help_text="Encrypted private-registry login, if any."
    )
    # The work of a transitional state (launch, stop, destroy; see WORK_STATES) is done by the
    # worker holding the lease: a random token, valid until it expires unless renewed. Attempts
    # count the tries at the current state's work; work_due_at is when a task for it was queued
    # or is next due (the work sweep queues it again once that is well past and no lease runs).
    lease_token = models.CharField(max_length=32, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    work_due_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    # When the current version began (created_at for the first).
    version_at = models.DateTimeField(null=True, blank=True)
    version_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["machine", "state"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=InstanceState.values), name="instance_state_known"
            ),
            models.CheckConstraint(
                condition=Q(launch_mode__in=LaunchMode.values), name="instance_launch_mode_known"
            ),
            models.CheckConstraint(
                condition=Q(slice_core_percent=None, slice_memory_mb=None)
                | Q(
                    gpu_count=1,
                    slice_core_percent__gte=1,
                    slice_core_percent__lte=100,
                    slice_memory_mb__gte=1,
                ),
                name="instance_whole_gpus_or_one_slice",
            ),
        ]

    def __str__(self) -> str:
        return f"instance {self.pk} ({self.state})"

    @property
    def container_name(self) -> str:
        # Deterministic, so a re-delivered launch task finds the container it already made;
        # version n of the spec runs in <name>-<n>.
        return version_container_name(self, self.version)

    @property
    def is_slice(self) -> bool:
        return self.slice_core_percent is not None

    @property
    def is_live(self) -> bool:
        return self.state not in (InstanceState.DESTROYED,)


def version_container_name(instance: Instance, number: int) -> str:
    base = f"gpumkt-{instance.uuid.hex[:12]}"
    return base if number == 1 else f"{base}-{number}"


# What a version of an instance's spec is: the fields a PATCH may change. A version's spec
# also has "ports" (its published container ports: PortAllocation rows, not a field).
VERSION_FIELDS = (
    "image", "env", "entrypoint", "args", "launch_mode", "gpu_count", "volumes", "disk_gb",
)  # fmt: skip


class InstanceVersion(models.Model):
    """An earlier version of an instance: its spec and its (stopped) container, kept as
    history to compare with, roll back to, or delete; or a later version whose launch failed
    (``failure``). The current version is the instance."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    spec = models.JSONField()
    container_id = models.CharField(max_length=80, blank=True)
    deleted = models.BooleanField(default=False, help_text="its container was removed")
    # Why this version's launch failed (the version before it runs again); "" for a version
    # that ran. A failed version has no container; it can be rolled back to (tried again).
    failure = models.CharField(max_length=500, blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField()
    replaced_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["instance", "number"]
        constraints = [
            models.UniqueConstraint(fields=["instance", "number"], name="instance_version_unique")
        ]

    def __str__(self) -> str:
        return f"instance {self.instance_id} v{self.number}"


class InstanceEvent(models.Model):
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.from_state or '∅'} → {self.to_state}: {self.reason}"


class GpuAllocation(models.Model):
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="gpu_allocations")
    gpu = models.ForeignKey("hosts.Gpu", on_delete=models.PROTECT, related_name="allocations")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(released_at=None), name="gpu_one_live_allocation"
            )
        ]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} → instance {self.instance_id}"


class GpuSlice(models.Model):
    """A slice of one card held by an instance: a percentage of its compute and MB of its
    memory. Live (unreleased) slices of a card never sum past 100 % or its memory, and never
    sit beside a live whole-GPU allocation of it: the database refuses the row (triggers in
    migration 0007_gpu_slices), as it refuses a GPU allocated twice."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="gpu_slices")
    gpu = models.ForeignKey("hosts.Gpu", on_delete=models.PROTECT, related_name="slices")
    core_percent = models.PositiveSmallIntegerField()
    memory_mb = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["gpu"], condition=Q(released_at=None), name="gpu_slice_live")
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(core_percent__gte=1, core_percent__lte=100, memory_mb__gte=1),
                name="gpu_slice_sizes",
            ),
            models.UniqueConstraint(
                fields=["instance"],
                condition=Q(released_at=None),
                name="gpu_slice_one_per_instance",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.core_percent}% / {self.memory_mb} MB of GPU {self.gpu_id} → instance {self.instance_id}"


class PortAllocation(models.Model):
    instance = models.ForeignKey(
        Instance, on_delete=models.CASCADE, related_name="port_allocations"
    )
    machine = models.ForeignKey("hosts.Machine", on_delete=models.PROTECT, related_name="+")
    host_port = models.PositiveIntegerField()
    container_port = models.PositiveIntegerField()
    protocol = models.CharField(max_length=3, default="tcp")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["machine", "host_port"],
                condition=Q(released_at=None),
                name="host_port_one_live_allocation",
            )
        ]
        indexes = [
            # The ports a machine gave back lately, which rest before reuse (hosts/ports.py).
            models.Index(
                fields=["machine", "released_at"],
                condition=Q(released_at__isnull=False),
                name="port_given_back",
            )
        ]

    def __str__(self) -> str:
        return f"{self.host_port}->{self.container_port}/{self.protocol}"


class PrivateRepository(models.Model):
    """A repository its registry serves to a login only, pulled onto a machine with one.

    Docker keeps a pulled image for anyone on the machine, so the image alone proves nothing:
    any later launch of this repository there pulls again, with that rental's own login (or
    none), and runs only if the registry lets it. Proven (``proven_at``) when a pull with a
    login succeeded and one without was refused; unproven while a pull with a login the
    registry accepted is under way (scheduler.services.private_images)."""

    machine = models.ForeignKey("hosts.Machine", on_delete=models.CASCADE)
    repository = models.CharField(max_length=255)
    first_pulled_at = models.DateTimeField(auto_now_add=True)
    proven_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["machine", "repository"], name="private_repository_once_per_machine"
            )
        ]

    def __str__(self) -> str:
        return f"{self.repository} on machine {self.machine_id}"
