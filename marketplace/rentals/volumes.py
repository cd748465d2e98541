"""Volumes: create, resize, delete, mount at renting, and their metering.

Creating and resizing change the host over the pooled SSH connection inside their
transaction: a host that does not answer fails the request (503) and rolls everything back,
so the rows never claim a volume the host lacks. Deleting settles at once and removes the
volume on its host after the commit (``volume_remove_on_host``): a machine out of service
gets it removed when it is back. The size is enforced on the host (``hosts.runtime.volumes``);
money follows the rentals' rules: a hold for the size × the period at creation, topped up
when the volume grows or its period is extended, captured per GB-second by the metering
sweep (``volume_metering``: the clock stops while the machine is out of service),
released when it is deleted.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from billing import holds
from core.task_queue import task_queue_on_commit
from hosts.models import Machine, MachineStatus, in_service
from hosts.runtime import CommandFailed, HostKeyMismatch, HostUnreachable
from hosts.runtime.volumes import MAX_VOLUME_GB, HostVolumes, VolumeUsage
from hosts.user_text import name_check
from marketplace.events import publish_team_events
from marketplace.fleet import machine_reference
from marketplace.models import Team, Volume, VolumeMount, VolumeState, VolumeVersion
from marketplace.models.volumes import volume_reference
from marketplace.rentals.volume_metering import volume_meter
from marketplace.services.pricing import MAX_RENTAL_HOURS, MIN_RENTAL_HOURS, storage_owed
from scheduler.models import InstanceState

logger = logging.getLogger(__name__)

DEFAULT_VOLUME_HOURS = 30 * 24
MAX_VOLUME_HOURS = 24 * 365


class VolumeInUse(Exception):
    http_status = 409
    error_code = "volume_in_use"


def _check_name(name: str) -> str:
    name = name.strip() if isinstance(name, str) else name
    name_check(name, "name", max_length=64)
    return name


def _check_size(size_gb: object) -> int:
    if (
        not isinstance(size_gb, int)
        or isinstance(size_gb, bool)
        or not 1 <= size_gb <= MAX_VOLUME_GB
    ):
        raise ValidationError({"size_gb": f"A whole number of GB from 1 to {MAX_VOLUME_GB}."})
    return size_gb


def volume_room_gb(machine: Machine, *, besides: Volume | None = None) -> int:
    """The GB of the machine's free disk not yet promised to volumes (what a new volume there
    may take)."""
    # A volume being removed still takes its disk until the host has removed it.
    others = Volume.objects.filter(
        machine=machine,
        state__in=(VolumeState.CREATING, VolumeState.READY, VolumeState.REMOVING),
    )
    if besides is not None:
        others = others.exclude(pk=besides.pk)
    promised = others.aggregate(total=Sum("size_gb"))["total"] or 0
    return max(machine.disk_free_gb - promised, 0)


def _room_check(machine: Machine, size_gb: int, *, besides: Volume | None = None) -> None:
    """A machine's volumes together may not exceed the disk its probe found free: each image is
    sparse and fills as it is written, so sizes promised past the disk would fill the host
    for every tenant. The caller holds the machine's lock."""
    left = volume_room_gb(machine, besides=besides)
    if size_gb > left:
        raise ValidationError(
            {"size_gb": f"Machine {machine.pk} has {left} GB of disk left for volumes."}
        )


def _version(volume: Volume, size_gb: int, change: str, user) -> VolumeVersion:
    number = (volume.versions.order_by("-number").values_list("number", flat=True).first()) or 0
    return VolumeVersion.objects.create(
        volume=volume, number=number + 1, size_gb=size_gb, change=change, created_by=user
    )


def _tell(volume: Volume, what: str) -> None:
    publish_team_events(
        "volume.changed",
        [(volume.team_id, {"id": volume.pk, "change": what, "size_gb": volume.size_gb})],
    )


@transaction.atomic
def volume_create(
    *, team: Team, user, machine_id: int, name: str, size_gb: int, hours: float
) -> Volume:
    """A volume of ``size_gb`` on a rentable machine, held for ``hours`` of storage."""
    name, size_gb = _check_name(name), _check_size(size_gb)
    if not (
        isinstance(hours, int | float) and math.isfinite(hours) and 1 <= hours <= MAX_VOLUME_HOURS
    ):
        raise ValidationError({"duration_hours": f"From 1 to {MAX_VOLUME_HOURS} hours."})
    machine = Machine.objects.select_for_update().filter(pk=machine_id).first()
    if machine is None or not machine.listed or machine.status != MachineStatus.ONLINE:
        raise ValidationError({"machine_id": "This machine is not offered for rent right now."})
    now = timezone.now()
    ends_at = now + timedelta(hours=hours)
    if machine.end_date and ends_at > machine.end_date:
        raise ValidationError(
            {
                "duration_hours": f"The machine is offered until {machine.end_date:%Y-%m-%d %H:%M} UTC."
            }
        )
    if Volume.objects.filter(
        team=team, machine=machine, name=name, state__in=(VolumeState.READY, VolumeState.CREATING)
    ).exists():
        raise ValidationError({"name": "Your team has a volume of this name on this machine."})
    _room_check(machine, size_gb)
    amount = storage_owed(
        price_per_gb_month=machine.storage_price_per_gb_month,
        disk_gb=size_gb,
        seconds=round(hours * 3600),
    )
    volume = Volume(
        team=team,
        provider_team_id=machine.team_id,
        machine=machine,
        name=name,
        size_gb=size_gb,
        storage_price_per_gb_month=machine.storage_price_per_gb_month,
        ends_at=ends_at,
        state=VolumeState.CREATING,
        clock_since=None,  # charged from when its host has made it
    )
    # The hold's reference names the volume's id, so the row comes first (its hold id is
    # set before the transaction ends; a failed hold rolls both back).
    volume.save()
    hold = holds.hold_create(
        team_id=team.pk,
        provider_team_id=machine.team_id,
        amount=amount,
        reference=volume_reference(volume.pk),
        idempotency_key=f"volume:{volume.uuid}:hold",
        description=f"Volume {name}: {size_gb} GB on machine {machine.pk} for {hours:g} h",
        machine_reference=machine_reference(machine.pk),
    )
    volume.hold_id = hold.pk
    volume.save(update_fields=["hold_id"])
    _version(volume, size_gb, "created", user)
    volume_id = volume.pk
    task_queue_on_commit("marketplace.tasks.volume_build", volume_id)
    return volume


# A volume its host has not made this long after it was asked for (the host silent all that
# time) fails, and its hold goes back.
CREATE_PATIENCE = timedelta(minutes=15)


def volume_create_on_host(*, volume_id: int) -> str:
    """Make a volume that is ``creating`` on its host, outside any transaction (a slow host
    holds no row locks), and record the outcome: ready (its clock starts), or failed with the
    host's reason (its hold released). A host that does not answer leaves it creating for
    the sweep, until ``CREATE_PATIENCE`` has passed. Idempotent (the host's script finishes
    what an earlier try began). Returns the volume's state."""
    volume = Volume.objects.select_related("machine").get(pk=volume_id)
    if volume.state != VolumeState.CREATING:
        return volume.state
    try:
        HostVolumes(volume.machine).create(volume.docker_name, volume.size_gb)
        if volume.cloned_from_id is not None:
            _copy_source(volume)
    except CloneFailed as error:
        return _creation_failed(volume_id, str(error))
    except CommandFailed as error:
        return _creation_failed(volume_id, f"The host could not make it: {error}")
    except (HostUnreachable, HostKeyMismatch) as error:
        if timezone.now() - volume.created_at > CREATE_PATIENCE:
            return _creation_failed(volume_id, f"The host did not answer: {error}")
        logger.warning("volume %s: host not reached (%s); the sweep tries again", volume_id, error)
        return VolumeState.CREATING
    with transaction.atomic():
        volume = Volume.objects.select_related("machine").select_for_update(of=("self",))
        volume = volume.get(pk=volume_id)
        made = volume.state == VolumeState.CREATING
        if made:
            volume.state = VolumeState.READY
            volume.clock_since = timezone.now() if in_service(volume.machine.status) else None
            volume.save(update_fields=["state", "clock_since"])
            _tell(volume, "created")  # sent on commit
    if not made and volume.state in (VolumeState.REMOVING, VolumeState.DELETED):
        # Deleted while its host made it: the removal may have run before; remove it again.
        volume_id_ = volume.pk
        Volume.objects.filter(pk=volume_id_, state=VolumeState.DELETED).update(
            state=VolumeState.REMOVING
        )
        volume_remove_on_host(volume_id=volume_id_)
    return Volume.objects.values_list("state", flat=True).get(pk=volume_id)


class CloneFailed(Exception):
    pass


def _copy_source(clone: Volume) -> None:
    """Copy the volume a clone was made from into it, on their machine (before the clone is
    ready, so nothing mounts it half copied). A copy that cannot be made removes what the host
    made of the clone (CloneFailed); a silent host leaves it for the sweep to try again."""
    host = HostVolumes(clone.machine)
    source = Volume.objects.filter(pk=clone.cloned_from_id, state=VolumeState.READY).first()
    try:
        if source is None:
            raise CloneFailed(f"Volume {clone.cloned_from_id} was deleted before it was copied.")
        host.copy(source.docker_name, clone.docker_name)
    except (CloneFailed, CommandFailed) as error:
        host.remove(clone.docker_name)
        reason = str(error) if isinstance(error, CloneFailed) else f"The copy failed: {error}"
        raise CloneFailed(reason) from None


@transaction.atomic
def volume_clone(*, source: Volume, user, name: str, size_gb: int | None, hours: float) -> Volume:
    """A new volume of the same team on the source's machine, holding a copy of what the source
    stores when its host makes it: at least the source's size (``size_gb``, or the source's),
    held and charged as any new volume. Files being written meanwhile may be copied part-way,
    as with any copy of a disk in use."""
    source = Volume.objects.select_for_update().get(pk=source.pk)
    if source.state != VolumeState.READY:
        raise ValidationError({"source": f"Volume {source.pk} is {source.state}, not ready."})
    size_gb = source.size_gb if size_gb is None else _check_size(size_gb)
    if size_gb < source.size_gb:
        raise ValidationError(
            {"size_gb": f"A clone is at least its source's size ({source.size_gb} GB)."}
        )
    clone = volume_create(
        team=source.team,
        user=user,
        machine_id=source.machine_id,
        name=name,
        size_gb=size_gb,
        hours=hours,
    )
    clone.cloned_from = source
    clone.save(update_fields=["cloned_from"])
    return clone


def _creation_failed(volume_id: int, reason: str) -> str:
    with transaction.atomic():
        volume = Volume.objects.select_for_update().get(pk=volume_id)
        if volume.state != VolumeState.CREATING:
            return volume.state
        holds.hold_release(hold_id=volume.hold_id)
        now = timezone.now()
        volume.state, volume.failure, volume.settled_at = VolumeState.FAILED, reason[:500], now
        volume.save(update_fields=["state", "failure", "settled_at"])
        _tell(volume, "failed")  # sent on commit
    logger.warning("volume %s failed: %s", volume_id, reason)
    return VolumeState.FAILED


def volumes_still_creating() -> list[int]:
    return list(
        Volume.objects.filter(state=VolumeState.CREATING)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def volume_extend(*, volume: Volume, hours: float) -> Volume:
    """Add ``hours`` to the volume's period and its size × the price × ``hours`` to its hold
    (402 when credit is short), never past the machine's end date; the rules and error
    shapes of a rental's extension. A period that has ended already starts again from now
    (the time since its end was not held, and is not charged)."""
    if not (
        isinstance(hours, int | float) and MIN_RENTAL_HOURS <= hours <= MAX_RENTAL_HOURS
    ):  # (NaN fails both)
        raise ValidationError(
            {
                "hours": f"Extend by at least {MIN_RENTAL_HOURS} and at most {MAX_RENTAL_HOURS} hours."
            }
        )
    with transaction.atomic():
        # The machine first (its end date cannot move meanwhile), then the volume.
        machine = Machine.objects.select_for_update().get(pk=volume.machine_id)
        volume = Volume.objects.select_for_update().get(pk=volume.pk)
        if volume.state != VolumeState.READY:
            raise ValidationError({"hours": "This volume was deleted."})
        now = timezone.now()
        ended = volume.ends_at <= now
        new_end = (now if ended else volume.ends_at) + timedelta(hours=hours)
        if machine.end_date and new_end > machine.end_date:
            raise ValidationError(
                {"hours": f"The machine is offered until {machine.end_date:%Y-%m-%d %H:%M} UTC."}
            )
        amount = storage_owed(
            price_per_gb_month=volume.storage_price_per_gb_month,
            disk_gb=volume.size_gb,
            seconds=round(hours * 3600),
        )
        if amount:
            holds.hold_extend(
                hold_id=volume.hold_id,
                amount=amount,
                idempotency_key=f"volume:{volume.uuid}:extend:{new_end.isoformat()}",
            )
        if ended:
            volume.gb_seconds = volume.gb_seconds_at(now)  # up to the old end
            if volume.clock_since is not None:
                volume.clock_since = now
        volume.ends_at = new_end
        volume.save(update_fields=["gb_seconds", "clock_since", "ends_at"])
        _tell(volume, "extended")  # sent on commit
    return volume


def volume_usage(volume: Volume) -> VolumeUsage:
    return HostVolumes(volume.machine).usage(volume.docker_name)


def _live_mounts(volume: Volume):
    return VolumeMount.objects.filter(volume=volume).exclude(
        instance__state=InstanceState.DESTROYED
    )


def volume_resize(*, volume: Volume, size_gb: int, user) -> Volume:
    """Grow or shrink to ``size_gb``: a new version. Growing holds the extra GB for the rest
    of the period (402 if short); shrinking is refused while more than the new size is
    stored. Done on the host while mounted and in use, outside any transaction: the resize is
    recorded on the row (``resizing_to``) and held for first, the host asked, and the new
    size recorded once it has done it. A host that fails raises (nothing changes but the
    hold, which keeps the extra it took until the volume is deleted: captures never pass
    what was used); a resize a dead worker left is finished by the sweep."""
    size_gb = _check_size(size_gb)
    if volume.state != VolumeState.READY:
        raise ValidationError({"size_gb": "This volume is not ready (being made, or deleted)."})
    if size_gb < volume.size_gb:
        # What it stores, read on the host before anything is locked; btrfs itself refuses a
        # shrink below it too (the host's error then).
        used = volume_usage(volume).used_bytes
        if used > size_gb * 1024**3:
            raise ValidationError(
                {
                    "size_gb": f"The volume stores {used / 1024**3:.2f} GB, more than {size_gb} GB; "
                    "delete data first."
                }
            )
    volume = _resize_begin(volume, size_gb)
    try:
        HostVolumes(volume.machine).resize(volume.docker_name, size_gb)
    except (CommandFailed, HostUnreachable, HostKeyMismatch):
        Volume.objects.filter(pk=volume.pk, resizing_to=size_gb).update(resizing_to=None)
        raise
    return _resize_record(volume.pk, size_gb, user)


@transaction.atomic
def _resize_begin(volume: Volume, size_gb: int) -> Volume:
    # The machine first, as renting locks it before the volumes it mounts; then the volume.
    machine = Machine.objects.select_for_update().get(pk=volume.machine_id)
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    volume.machine = machine
    if volume.state != VolumeState.READY:
        raise ValidationError({"size_gb": "This volume is not ready (being made, or deleted)."})
    if volume.resizing_to is not None:
        raise ValidationError({"size_gb": "A resize of this volume is under way; look again."})
    if size_gb == volume.size_gb:
        raise ValidationError({"size_gb": f"The volume is {size_gb} GB already."})
    if size_gb > volume.size_gb:
        _room_check(machine, size_gb, besides=volume)
    now = timezone.now()
    if now >= volume.ends_at:
        raise ValidationError(
            {"size_gb": "This volume's period has ended; extend it or delete it."}
        )
    if size_gb > volume.size_gb:
        extra = storage_owed(
            price_per_gb_month=volume.storage_price_per_gb_month,
            disk_gb=size_gb - volume.size_gb,
            seconds=int((volume.ends_at - now).total_seconds()),
        )
        if extra:
            holds.hold_extend(
                hold_id=volume.hold_id,
                amount=extra,
                idempotency_key=(
                    f"volume:{volume.uuid}:resize:{volume.versions.count() + 1}:{size_gb}"
                ),
            )
    volume.resizing_to = size_gb
    volume.save(update_fields=["resizing_to"])
    return volume


def _resize_record(volume_id: int, size_gb: int, user) -> Volume:
    """The host has the new size: charge it from now (the time before at the old size) and
    record the version. A volume deleted meanwhile is left as it is."""
    with transaction.atomic():
        volume = Volume.objects.select_related("machine").select_for_update(of=("self",))
        volume = volume.get(pk=volume_id)
        if volume.state != VolumeState.READY or volume.resizing_to != size_gb:
            return volume
        now = timezone.now()
        change = f"{'grown' if size_gb > volume.size_gb else 'shrunk'} from {volume.size_gb} GB"
        volume.gb_seconds = volume.gb_seconds_at(now)
        if volume.clock_since is not None:  # a stopped clock (machine out of service) stays so
            volume.clock_since = min(now, volume.ends_at)
        volume.size_gb, volume.resizing_to = size_gb, None
        volume.save(update_fields=["gb_seconds", "clock_since", "size_gb", "resizing_to"])
        _version(volume, size_gb, change, user)
        _tell(volume, "resized")  # sent on commit
    return volume


def volumes_resize_finish() -> int:
    """Finish the resizes a request left half done (its worker died between asking for it and
    recording it): the host's script is idempotent, so it is asked again and the outcome
    recorded. Run by the sweep; returns how many were finished."""
    done = 0
    pending = Volume.objects.filter(state=VolumeState.READY, resizing_to__isnull=False)
    for volume in pending.select_related("machine").filter(machine__status=MachineStatus.ONLINE):
        size_gb = volume.resizing_to
        try:
            HostVolumes(volume.machine).resize(volume.docker_name, size_gb)
        except (CommandFailed, HostUnreachable, HostKeyMismatch):
            logger.warning("volume %s: resize to %s GB not finished yet", volume.pk, size_gb)
            continue
        _resize_record(volume.pk, size_gb, None)
        done += 1
    return done


@transaction.atomic
def volume_delete(*, volume: Volume) -> Volume:
    """Settle at once (what was used is captured, the rest of the hold released: nothing is
    charged from now on) and remove it from its host after the commit; a machine out of
    service, or a removal that fails, leaves it ``removing`` until the machine is back or the
    next sweep. Refused (409) while a rental that is not destroyed mounts it."""
    machine = Machine.objects.select_for_update().get(pk=volume.machine_id)
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    volume.machine = machine
    if volume.state == VolumeState.FAILED:
        # Settled when it failed; what its host may have begun is cleaned up like a removal.
        volume.state, volume.deleted_at = VolumeState.REMOVING, timezone.now()
        volume.save(update_fields=["state", "deleted_at"])
        _remove_after_commit(volume)
        return volume
    if volume.state not in (VolumeState.READY, VolumeState.CREATING):
        return volume
    mounted = list(_live_mounts(volume).values_list("instance_id", flat=True))
    if mounted:
        raise VolumeInUse(
            f"Instance {', '.join(map(str, mounted))} mounts this volume; destroy it first."
        )
    now = timezone.now()
    volume_meter(volume=volume, now=now)
    holds.hold_release(hold_id=volume.hold_id)
    volume.gb_seconds = volume.gb_seconds_at(now)
    volume.clock_since = None
    volume.state, volume.deleted_at, volume.settled_at = VolumeState.REMOVING, now, now
    volume.save(update_fields=["gb_seconds", "clock_since", "state", "deleted_at", "settled_at"])
    _tell(volume, "deleted")  # sent on commit
    _remove_after_commit(volume)
    return volume


def _remove_after_commit(volume: Volume) -> None:
    if in_service(volume.machine.status):
        volume_id = volume.pk
        task_queue_on_commit("marketplace.tasks.volume_remove", volume_id)


def volume_remove_on_host(*, volume_id: int) -> bool:
    """Remove a deleted volume from its host (outside any transaction: a slow host holds no
    row locks) and record it as deleted. Idempotent: the host's script removes what is left
    of it, and a volume already deleted is left alone. False (still ``removing``, for the
    next sweep or the machine's return) when its machine is out of service or the host did
    not do it."""
    volume = Volume.objects.select_related("machine").filter(pk=volume_id).first()
    if volume is None or volume.state != VolumeState.REMOVING:
        return False
    if not in_service(volume.machine.status):
        return False
    try:
        HostVolumes(volume.machine).remove(volume.docker_name)
    except (CommandFailed, HostUnreachable, HostKeyMismatch):
        logger.warning("could not remove volume %s on its host; retried later", volume_id)
        return False
    Volume.objects.filter(pk=volume_id, state=VolumeState.REMOVING).update(
        state=VolumeState.DELETED
    )
    return True


def volumes_pending_removal(*, machine_id: int | None = None) -> list[int]:
    """Deleted volumes still on an in-service host (the removal sweep's and the machine's
    return's work)."""
    pending = Volume.objects.filter(
        state=VolumeState.REMOVING, machine__status=MachineStatus.ONLINE
    )
    if machine_id is not None:
        pending = pending.filter(machine_id=machine_id)
    return list(pending.order_by("pk").values_list("pk", flat=True))


def volumes_due_for_deletion(now: datetime | None = None) -> list[int]:
    """Volumes whose period ended more than the data grace period ago (``DATA_GRACE_HOURS``,
    as rentals' data) and that no live rental mounts: the expiry sweep deletes them, so a
    volume never outlives what was paid for and the provider gets the disk back."""
    now = now or timezone.now()
    grace = timedelta(hours=settings.DATA_GRACE_HOURS)
    mounted = VolumeMount.objects.exclude(instance__state=InstanceState.DESTROYED).values(
        "volume_id"
    )
    return list(
        Volume.objects.filter(state=VolumeState.READY, ends_at__lte=now - grace)
        .exclude(pk__in=mounted)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
