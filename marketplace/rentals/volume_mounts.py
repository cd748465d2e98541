"""Mounting a team's volumes into a rental at renting: the checks of what a rental asks for,
the lock that keeps a volume from being deleted under a rental being made, and the mounts'
rows. (Split from ``volumes.py``, which makes, resizes, clones and deletes volumes.)"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.utils import timezone

from hosts.runtime import InvalidContainerSpec
from hosts.runtime.container_spec import validate_volumes
from marketplace.models import Team, Volume, VolumeMount, VolumeState
from scheduler.models import Instance

MAX_MOUNTS = 8


@dataclass(frozen=True)
class MountRequest:
    volume_id: int
    target: str


def mounts_check(
    *, team: Team, machine_id: int, requested: list[MountRequest]
) -> list[tuple[Volume, str]]:
    """The team's volumes a rental asks for, each at its path: ValidationError naming
    ``volumes`` for another team's or a deleted volume (as if it did not exist), one on
    another machine, a path that is not allowed, or the same volume twice."""
    if not requested:
        return []
    if len(requested) > MAX_MOUNTS:
        raise ValidationError({"volumes": f"At most {MAX_MOUNTS} volumes."})
    found = {
        volume.pk: volume
        for volume in Volume.objects.filter(
            team=team, state=VolumeState.READY, pk__in=[m.volume_id for m in requested]
        )
    }
    pairs = []
    for mount in requested:
        volume = found.get(mount.volume_id)
        if volume is None:
            raise ValidationError({"volumes": f"Your team has no volume {mount.volume_id}."})
        if volume.ends_at <= timezone.now():
            raise ValidationError(
                {"volumes": f"Volume {volume.pk}'s period ended; it can only be deleted now."}
            )
        if volume.machine_id != machine_id:
            raise ValidationError(
                {
                    "volumes": f"Volume {volume.pk} is on machine {volume.machine_id}; rent there to mount it."
                }
            )
        pairs.append((volume, mount.target))
    if len({volume.pk for volume, _ in pairs}) != len(pairs):
        raise ValidationError({"volumes": "The same volume is mounted twice."})
    try:
        validate_volumes([(volume.docker_name, target) for volume, target in pairs])
    except InvalidContainerSpec as error:
        raise ValidationError({"volumes": error.reason}) from error
    return pairs


def mounts_lock_ready(volume_ids: list[int]) -> set[int]:
    """Lock the volumes a batch of rentals mounts (a delete waits, or is waited for) and
    return those still ready."""
    return set(
        Volume.objects.select_for_update()
        .filter(pk__in=sorted(set(volume_ids)), state=VolumeState.READY)
        .values_list("pk", flat=True)
    )


def mounts_write(instance: Instance, pairs: list[tuple[Volume, str]]) -> None:
    VolumeMount.objects.bulk_create(
        [VolumeMount(volume=volume, instance=instance, target=target) for volume, target in pairs]
    )
