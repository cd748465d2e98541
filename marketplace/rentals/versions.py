"""Versions of a rental's container: change its spec (a new version on the same machine and
GPUs), roll back to an earlier version's spec, delete an earlier version's container, and
commit the container as the team's private image (usable by the team's later rentals on that
machine only). The console's and the API's one place for these writes."""

from __future__ import annotations

import logging
import re

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from hosts.models import Machine
from hosts.runtime import (
    CommandFailed,
    DockerHost,
    HostUnreachable,
    InvalidContainerSpec,
    image_reference,
    image_repository,
    validate_image,
)
from marketplace.events import publish_instance_event
from marketplace.models import CommittedImage, Rental, Team, Volume, VolumeMount, VolumeState
from marketplace.rentals.metering import BANK_STORAGE_FIELDS, rental_bank_storage_owed
from marketplace.rentals.volume_mounts import (
    MountRequest,
    mounts_check,
    mounts_lock_ready,
    mounts_write,
)
from marketplace.services.offers import offer_refresh
from marketplace.services.pricing import rental_hold_grow
from marketplace.services.registries import registry_check
from marketplace.validation import validate_launch
from scheduler import services as scheduler
from scheduler.models import (
    GpuAllocation,
    GpuSlice,
    Instance,
    InstanceState,
    InstanceVersion,
    LaunchMode,
)
from scheduler.placement import slice_fraction
from scheduler.services import (
    JUPYTER_CONTAINER_PORT,
    SSH_CONTAINER_PORT,
    FreeCapacity,
    InvalidTransition,
    NoCapacity,
    allocations_write,
)
from scheduler.work import work_enqueue_on_commit

logger = logging.getLogger(__name__)

# A committed image is named for its team, so no other team's name can be the same, and a
# rental naming another team's prefix is refused (``committed_image_check``).
COMMITTED_PREFIX = "gpumkt-team-"
_COMMITTED = re.compile(rf"^{COMMITTED_PREFIX}(\d+)/")
_REPOSITORY = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)?$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def committed_image_check(*, team: Team, machine_id: int, image: str) -> None:
    """A committed image (``gpumkt-team-<id>/…``) runs only for its team, on the machine it
    was committed on: anything else is refused as if it did not exist (ValidationError
    naming ``image``). Docker would otherwise run any image it has for anyone."""
    # As Docker names it: `docker.io/` and `index.docker.io/` before the name are Docker
    # Hub's own spellings and reach the same local image.
    name = image_repository(image or "").removeprefix("docker.io/")
    found = _COMMITTED.match(name)
    if found is None:
        return
    tagged = image_reference(image)
    tag_or_digest = tagged[len(tagged.split("@", 1)[0].rsplit(":", 1)[0]) :]
    reference = name + tag_or_digest
    ours = (
        int(found.group(1)) == team.pk
        and CommittedImage.objects.filter(
            team=team, machine_id=machine_id, reference=reference
        ).exists()
    )
    if not ours:
        raise ValidationError(
            {"image": f"'{image[:80]}' is not one of your team's images on this machine."}
        )


def _within_period(instance: Instance) -> None:
    if instance.rental.ends_at <= timezone.now():
        raise InvalidTransition("The rental period is over; extend it first.")


def _check_spec(instance: Instance, spec: dict, asked_ports: list[int]) -> None:
    if spec["launch_mode"] not in LaunchMode.values:
        raise ValidationError({"launch_mode": f"Choose one of {', '.join(LaunchMode.values)}."})
    validate_launch(
        image=spec["image"],
        env=dict(spec["env"]),
        ports=list(asked_ports),
        entrypoint=spec["entrypoint"],
        args=list(spec["args"]),
    )
    disk = spec["disk_gb"]
    most = _max_disk_gb(instance, spec["gpu_count"])
    if not isinstance(disk, int) or isinstance(disk, bool) or not 1 <= disk <= most:
        raise ValidationError({"disk_gb": f"Choose between 1 and {most} GB on this machine."})
    registry_check(image=spec["image"], allow_private=instance.machine.allow_private_registries)
    committed_image_check(team=instance.team, machine_id=instance.machine_id, image=spec["image"])


def _max_disk_gb(instance: Instance, gpus: int) -> int:
    """The most disk the machine gives a rental of this size: a unit's disk per GPU, or a
    slice's fraction of one unit (as at renting)."""
    machine = instance.machine
    if instance.is_slice:
        card_memory = (
            GpuSlice.objects.filter(instance=instance, released_at=None)
            .values_list("gpu__memory_mib", flat=True)
            .first()
        )
        fraction = slice_fraction(
            instance.slice_core_percent, instance.slice_memory_mb, card_memory or 1
        )
        return max(int(machine.unit_disk_gb * fraction), 1)
    return max(int(machine.unit_disk_gb * max(gpus, 1)), 1)


def _published(spec: dict) -> list[int]:
    """The container ports a spec publishes: those asked for, and its launch mode's own (SSH
    22, Jupyter 8888), as at renting."""
    ports = [int(port) for port in dict.fromkeys(spec.get("ports") or [])]
    mode_port = {LaunchMode.SSH: SSH_CONTAINER_PORT, LaunchMode.JUPYTER: JUPYTER_CONTAINER_PORT}
    needed = mode_port.get(spec["launch_mode"])
    if needed is not None and needed not in ports:
        ports.append(needed)
    return sorted(ports)


def rental_new_version(*, instance: Instance, changes: dict, by: str, reason: str = "") -> Instance:
    """Run the instance's spec with ``changes`` as its next version: the current container
    stops (and is kept), a new one starts on the same GPUs. 400 when nothing changes or the
    spec is refused, 409 when the instance is not running or exited (or the machine lacks
    the GPUs or host ports it needs), 402 when the hold cannot grow for more GPUs or disk."""
    current = scheduler.version_spec(instance)
    changes = dict(changes)
    mounts = _mounts_for(instance, changes)
    spec = {**current, **changes}
    asked_ports = list(changes.get("ports", []))
    spec["ports"] = _published(spec)
    if spec == current:
        raise ValidationError({"non_field_errors": "This is the current spec: nothing to change."})
    _check_spec(instance, spec, asked_ports)
    _within_period(instance)
    changed = sorted(name for name in spec if spec[name] != current[name])
    number = scheduler.next_version_number(instance)
    reason = reason or f"Version {number}: changed {', '.join(changed)}"
    gpus = spec["gpu_count"]
    if gpus != instance.gpu_count:
        _check_gpu_count(instance, gpus)
    prepared = scheduler.instance_version_prepare(instance_id=instance.pk)
    try:
        with transaction.atomic():
            if spec["ports"] != current["ports"]:
                # New host ports from the machine's range (409 when it is full); dropped
                # ones are released. Under the machine's lock, as at renting.
                scheduler.instance_ports_set(instance=instance, container_ports=spec["ports"])
            if gpus != instance.gpu_count:
                _gpus_follow(instance, gpus, number)
            if spec["disk_gb"] != current["disk_gb"]:
                _disk_follow(instance, spec["disk_gb"], number)
            if mounts is not None:
                _mounts_follow(instance, mounts)
            moved = scheduler.instance_version_begin(
                instance_id=instance.pk,
                expected_version=instance.version,
                changes={name: spec[name] for name in changed},
                by=by,
                reason=reason,
                current_spec=current,
            )
            work_enqueue_on_commit(instance.pk, InstanceState.LAUNCHING)
    except Exception:
        # Refused after its container was stopped (GPUs taken meanwhile, short credit): the
        # current version carries on.
        _restart_quietly(prepared)
        raise
    return moved


def _mounts_for(instance: Instance, changes: dict) -> list | None:
    """The volumes a change mounts, checked as at renting (the team's own, on this machine),
    with ``changes["volumes"]`` made the spec's [name on the host, path] pairs. From the API
    they come as MountRequests; from a rollback as an earlier spec's pairs, whose volumes
    must still be there. None when the volumes do not change."""
    if "volumes" not in changes:
        return None
    wanted = changes["volumes"]
    if wanted and not isinstance(wanted[0], MountRequest):
        ready = {
            volume.docker_name: volume
            for volume in Volume.objects.filter(
                team_id=instance.team_id, machine_id=instance.machine_id, state=VolumeState.READY
            )
        }
        missing = [name for name, _ in wanted if name not in ready]
        if missing:
            raise ValidationError({"volumes": "A volume of that version was deleted."})
        wanted = [MountRequest(volume_id=ready[name].pk, target=target) for name, target in wanted]
    pairs = mounts_check(team=instance.team, machine_id=instance.machine_id, requested=wanted)
    changes["volumes"] = [[volume.docker_name, target] for volume, target in pairs]
    return pairs


def _mounts_follow(instance: Instance, pairs: list) -> None:
    """The instance's mounts become the new version's (its volumes locked, still there)."""
    ids = [volume.pk for volume, _ in pairs]
    if set(ids) - mounts_lock_ready(ids):
        raise ValidationError({"volumes": "A volume was deleted meanwhile."})
    VolumeMount.objects.filter(instance=instance).delete()
    mounts_write(instance, pairs)


def _restart_quietly(instance: Instance) -> None:
    try:
        DockerHost(instance.machine).start(instance.container_id or instance.container_name)
    except (CommandFailed, HostUnreachable):
        logger.warning("could not restart instance %s's container", instance.pk, exc_info=True)


def _check_gpu_count(instance: Instance, gpus: int) -> None:
    """A count the machine could give (checked again under its lock: ``_gpus_follow``)."""
    machine = instance.machine
    if instance.is_slice:
        raise ValidationError(
            {"num_gpus": "This rental is a slice of one GPU; rent whole GPUs to change the count."}
        )
    present = machine.gpu_count
    if not isinstance(gpus, int) or not max(machine.min_gpus, 1) <= gpus <= present:
        raise ValidationError(
            {"num_gpus": f"From {max(machine.min_gpus, 1)} to {present} on this machine."}
        )
    extra = gpus - instance.gpu_count
    free = len(FreeCapacity([machine]).free_gpu_ids[machine.pk])
    if extra > free:
        raise NoCapacity(
            f"{extra} more GPU(s) are needed on machine {machine.pk}, and {free} are free."
        )


def _gpus_follow(instance: Instance, gpus: int, number: int) -> None:
    """Under the machine's and the rental's locks: take the extra GPUs (409 naming what is
    missing) or give the highest back; bank the GPU-seconds used at the old count; hold the
    extra GPUs' price for the rest of the period (402 when short)."""
    machine = Machine.objects.select_for_update().get(pk=instance.machine_id)
    rental = Rental.objects.select_for_update(of=("self",)).get(instance_id=instance.pk)
    now = timezone.now()
    extra = gpus - rental.gpu_count
    if extra > 0:
        gpu_ids, _ = FreeCapacity([machine]).take(
            machine.pk, extra, []
        )  # NoCapacity names what is missing
        allocations_write([(instance, gpu_ids, [], None)])
        rental_hold_grow(
            rental,
            now=now,
            gpu_rate_per_hour=rental.price_per_gpu_hour * extra,
            idempotency_key=f"rental:{instance.uuid}:gpus:v{number}",
        )
    else:
        held = GpuAllocation.objects.filter(instance=instance, released_at=None)
        give_back = list(held.order_by("-gpu__index").values_list("pk", flat=True)[:-extra])
        GpuAllocation.objects.filter(pk__in=give_back).update(released_at=now)
    _bank_gpu_count(rental, gpus, now)
    transaction.on_commit(lambda: offer_refresh(machine_id=machine.pk))


def _disk_follow(instance: Instance, disk_gb: int, number: int) -> None:
    """Under the rental's lock: bank what storage owes at the old size (time used is never
    repriced), charge the new size from now, and hold the extra GB for the rest of the
    period when it grows (402 when short; a smaller disk leaves the hold as it is)."""
    rental = Rental.objects.select_for_update(of=("self",)).get(instance_id=instance.pk)
    now = timezone.now()
    extra = disk_gb - rental.disk_gb
    if extra > 0:
        rental_hold_grow(
            rental,
            now=now,
            disk_gb=extra,
            idempotency_key=f"rental:{instance.uuid}:disk:v{number}",
        )
    _bank_disk(rental, disk_gb, now)


def _bank_disk(rental: Rental, disk_gb: int, now) -> None:
    rental_bank_storage_owed(rental, now)
    rental.disk_gb = disk_gb
    rental.save(update_fields=[*BANK_STORAGE_FIELDS, "disk_gb"])


def _bank_gpu_count(rental: Rental, gpus: int, now) -> None:
    """Bank the GPU-seconds used at the old count; the clock runs on at ``gpus``."""
    rental.gpu_unit_seconds += rental.gpu_count * rental.gpu_seconds_at(now)
    rental.gpu_seconds = 0
    if rental.gpu_clock_since is not None:
        rental.gpu_clock_since = min(now, rental.ends_at)
    rental.gpu_count = gpus
    rental.save(update_fields=["gpu_unit_seconds", "gpu_seconds", "gpu_clock_since", "gpu_count"])


@transaction.atomic
def rental_follow_version(*, instance_id: int) -> None:
    """The rental follows the version its instance runs, as it is now: after a failed
    version gave way to the one before it (``scheduler.instance_version_fall_back``) the
    GPU count and disk charged and the volumes mounted are that version's again. Idempotent; the hold
    is left as it is (it covers the larger of the two counts already)."""
    rental = (
        Rental.objects.select_for_update(of=("self",))
        .select_related("instance")
        .filter(instance_id=instance_id, settled_at=None)
        .first()
    )
    if rental is None:
        return
    instance = rental.instance
    if not instance.is_slice and rental.gpu_count != instance.gpu_count:
        _bank_gpu_count(rental, instance.gpu_count, timezone.now())
    if rental.disk_gb != instance.disk_gb:
        _bank_disk(rental, instance.disk_gb, timezone.now())
    wanted = sorted((name, target) for name, target in instance.volumes or [])
    mounts = VolumeMount.objects.filter(instance=instance).select_related("volume")
    if sorted((m.volume.docker_name, m.target) for m in mounts) != wanted:
        ready = {
            volume.docker_name: volume
            for volume in Volume.objects.filter(
                team_id=instance.team_id, machine_id=instance.machine_id, state=VolumeState.READY
            )
        }
        VolumeMount.objects.filter(instance=instance).delete()
        mounts_write(instance, [(ready[n], t) for n, t in wanted if n in ready])


def rental_rollback(*, instance: Instance, number: int, by: str) -> Instance:
    """A new version with version ``number``'s spec."""
    if number == instance.version:
        raise ValidationError({"version": f"Version {number} is the current version."})
    version = InstanceVersion.objects.filter(instance=instance, number=number).first()
    if version is None:
        raise ValidationError({"version": f"There is no version {number} to roll back to."})
    return rental_new_version(
        instance=instance,
        changes=dict(version.spec),
        by=by,
        reason=f"Version {scheduler.next_version_number(instance)}: "
        f"rolled back to version {number}",
    )


def rental_version_delete(*, instance: Instance, number: int) -> None:
    scheduler.instance_version_delete(instance_id=instance.pk, number=number)
    publish_instance_event(instance.team_id, instance.pk, "instance.version", {"deleted": number})


def rental_commit(*, instance: Instance, repository: str, tag: str, by: str) -> CommittedImage:
    """``docker commit`` the current container as ``gpumkt-team-<team>/<repository>:<tag>``
    on its machine: the team's private image there."""
    repository, tag = (repository or "").strip().lower(), (tag or "latest").strip()
    if not _REPOSITORY.fullmatch(repository) or len(repository) > 100:
        raise ValidationError(
            {"repository": "Lower-case letters, digits and . _ - (one / at most), like my-model."}
        )
    if not _TAG.fullmatch(tag):
        raise ValidationError({"tag": "Letters, digits and . _ - (up to 128), like v1."})
    reference = f"{COMMITTED_PREFIX}{instance.team_id}/{repository}:{tag}"
    try:
        validate_image(reference)
    except InvalidContainerSpec as error:
        raise ValidationError({"repository": error.reason}) from error
    if instance.state not in (InstanceState.RUNNING, InstanceState.EXITED, InstanceState.PAUSED):
        raise InvalidTransition(f"An instance that is {instance.state} has no container to commit.")
    DockerHost(instance.machine).commit(instance.container_id, reference)
    image, _ = CommittedImage.objects.update_or_create(
        team=instance.team,
        machine=instance.machine,
        reference=reference,
        defaults={"instance_id": instance.pk, "version": instance.version, "created_by": by[:150]},
    )
    publish_instance_event(
        instance.team_id, instance.pk, "instance.version", {"committed": reference}
    )
    return image
