"""A volume's storage clock and its metering: charged per GB-second of its size from its own
hold, while its machine is in service (the clock follows the machine's status, as a rental's
storage does), never past its period's end."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing import holds
from hosts.models import Machine, MachineStatus, in_service
from marketplace.models import Volume, VolumeState
from marketplace.services.pricing import storage_owed


def _owed(volume: Volume, now: datetime) -> int:
    return storage_owed(
        price_per_gb_month=volume.storage_price_per_gb_month,
        disk_gb=1,
        seconds=volume.gb_seconds_at(now),
    )


def volume_meter(*, volume: Volume, now: datetime | None = None) -> int:
    """Capture the storage owed so far beyond what was captured (0 on a repeated run)."""
    if volume.settled_at is not None:
        return 0
    return holds.hold_capture_usage(
        hold_id=volume.hold_id, kind="storage", owed_total=_owed(volume, now or timezone.now())
    )


def volumes_meter_sweep(*, now: datetime | None = None) -> int:
    """The metering sweep's share for volumes: capture every open volume's storage, after
    putting in step the clocks a lost machine-status event left running or stopped."""
    volumes_resync()
    now = now or timezone.now()
    total = 0
    for volume in Volume.objects.filter(settled_at=None).order_by("pk").iterator():
        total += volume_meter(volume=volume, now=now)
    return total


@transaction.atomic
def volumes_follow_machine(*, machine_id: int) -> int:
    """The machine left service (its volumes' clocks stop: nothing stored there is charged
    while it is out) or came back (they run again), as its status is now, so status events
    handled late, twice or out of order end the same way. Only the clocks change; the
    metering sweep captures. Returns how many clocks changed."""
    volumes = list(
        Volume.objects.select_for_update()
        .filter(machine_id=machine_id, settled_at=None, state=VolumeState.READY)
        .order_by("pk")
    )
    # Read after the locks: the latest status.
    online = in_service(Machine.objects.values_list("status", flat=True).get(pk=machine_id))
    now = timezone.now()
    changed = 0
    for volume in volumes:
        if online and volume.clock_since is None:
            volume.clock_since = now
        elif not online and volume.clock_since is not None:
            volume.gb_seconds = volume.gb_seconds_at(now)
            volume.clock_since = None
        else:
            continue
        volume.save(update_fields=["gb_seconds", "clock_since"])
        changed += 1
    return changed


def volumes_resync() -> int:
    """Follow the machines whose open volumes' clocks disagree with their status (what a
    lost event leaves); normally none."""
    online = Q(machine__status=MachineStatus.ONLINE)
    out_of_step = Volume.objects.filter(settled_at=None, state=VolumeState.READY).filter(
        (online & Q(clock_since=None)) | (~online & Q(clock_since__isnull=False))
    )
    changed = 0
    for machine_id in sorted(set(out_of_step.values_list("machine_id", flat=True))):
        changed += volumes_follow_machine(machine_id=machine_id)
    return changed
