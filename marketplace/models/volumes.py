"""Volumes: storage of a fixed size on one machine that outlives rentals. A team creates one,
mounts it into its rentals on that machine, grows or shrinks it (each size is a version) and
deletes it once nothing mounts it. Its size is enforced on the host (hosts.runtime.volumes);
it is charged per GB-month like a rental's storage, from a hold of its own."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q


def volume_reference(volume_id: int) -> str:
    """What the ledger calls a volume (its hold, captures, invoice lines)."""
    return f"volume:{volume_id}"


class VolumeState(models.TextChoices):
    # Held and recorded; its host makes it after the commit (``volume_create_on_host``).
    # Not charged, not mountable until it is ready.
    CREATING = "creating", "Creating"
    READY = "ready", "Ready"
    # Deleted by its team and settled (nothing is charged), still to be removed on its host:
    # its machine was out of service, or the removal has not run yet. The machine coming
    # back, or a sweep, removes it and it becomes deleted.
    REMOVING = "removing", "Removing"
    DELETED = "deleted", "Deleted"
    # Its host refused to make it (``failure`` says why): its hold went back.
    FAILED = "failed", "Failed"


class Volume(models.Model):
    """Storage clock: ``gb_seconds`` accumulated at earlier sizes, plus ``size_gb`` × the time
    since ``clock_since`` while it runs; never past ``ends_at`` (what the hold covers). The
    clock stops while the machine is out of service (``volumes_follow_machine``)."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    team = models.ForeignKey("marketplace.Team", on_delete=models.CASCADE, related_name="volumes")
    provider_team = models.ForeignKey(
        "marketplace.Team", on_delete=models.PROTECT, related_name="provided_volumes"
    )
    machine = models.ForeignKey("hosts.Machine", on_delete=models.PROTECT, related_name="volumes")
    name = models.CharField(max_length=64)
    size_gb = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=VolumeState.choices, default=VolumeState.READY)
    failure = models.CharField(max_length=500, blank=True)
    # A resize under way: held for and recorded here before the host is asked (outside any
    # transaction); the size becomes it once the host has done it. Null otherwise.
    resizing_to = models.PositiveIntegerField(null=True, blank=True)
    storage_price_per_gb_month = models.BigIntegerField(help_text="micro-dollars, fixed")
    # Null only inside the creating transaction: the hold's reference names the volume's id.
    hold_id = models.BigIntegerField(unique=True, null=True)
    gb_seconds = models.BigIntegerField(default=0)
    clock_since = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # A clone: made with a copy of what this volume stored when its host made it.
    cloned_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="clones"
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(size_gb__gte=1), name="volume_size_min1"),
            models.UniqueConstraint(
                fields=["team", "machine", "name"],
                condition=Q(state__in=["ready", "creating"]),
                name="volume_name_unique_per_team_machine",
            ),
        ]

    def __str__(self) -> str:
        return f"volume {self.name} ({self.size_gb} GB)"

    @property
    def docker_name(self) -> str:
        """The volume's name on its host (Docker's and the image's): the platform's, never
        the renter's text."""
        return f"gpumkt-vol-{self.uuid.hex[:16]}"

    @property
    def reference(self) -> str:
        return volume_reference(self.pk)

    def gb_seconds_at(self, now: datetime) -> int:
        if self.clock_since is None:
            return self.gb_seconds
        until = min(now, self.ends_at)
        return self.gb_seconds + self.size_gb * max(
            int((until - self.clock_since).total_seconds()), 0
        )


class VolumeVersion(models.Model):
    """One size the volume had: 1 at creation, one more at each resize."""

    volume = models.ForeignKey(Volume, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    size_gb = models.PositiveIntegerField()
    change = models.CharField(max_length=200)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["volume", "number"]
        constraints = [
            models.UniqueConstraint(fields=["volume", "number"], name="volume_version_unique")
        ]

    def __str__(self) -> str:
        return f"volume {self.volume_id} v{self.number}: {self.size_gb} GB"


class VolumeMount(models.Model):
    """A volume mounted into a rental's container at ``target``; it holds the volume (no
    delete) until the instance is destroyed."""

    volume = models.ForeignKey(Volume, on_delete=models.PROTECT, related_name="mounts")
    instance = models.ForeignKey(
        "scheduler.Instance", on_delete=models.CASCADE, related_name="volume_mounts"
    )
    target = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["instance", "target"], name="volume_mount_one_per_path")
        ]

    def __str__(self) -> str:
        return f"volume {self.volume_id} at {self.target} of instance {self.instance_id}"


class CommittedImage(models.Model):
    """An image a team made with ``docker commit`` from one of its rentals: it exists on that
    machine only, and only the team's rentals there may run it."""

    team = models.ForeignKey(
        "marketplace.Team", on_delete=models.CASCADE, related_name="committed_images"
    )
    machine = models.ForeignKey("hosts.Machine", on_delete=models.CASCADE, related_name="+")
    reference = models.CharField(max_length=255)
    instance_id = models.BigIntegerField(help_text="the instance it was committed from")
    version = models.PositiveIntegerField()
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "machine", "reference"], name="committed_image_once"
            )
        ]

    def __str__(self) -> str:
        return self.reference
