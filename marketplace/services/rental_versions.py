"""Versions of a rental's container: change its spec (a new version on the same machine and
GPUs), roll back to an earlier version's spec, delete an earlier version's container, and
commit the container as the team's private image (usable by the team's later rentals on that
machine only). The console's and the API's one place for these writes."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from hosts.runtime import DockerHost, InvalidContainerSpec, validate_image
from marketplace.events import publish_instance_event
from marketplace.models import CommittedImage, Team
from marketplace.services.registries import registry_check
from marketplace.validation import validate_launch
from scheduler import services as scheduler
from scheduler.models import Instance, InstanceState, InstanceVersion, LaunchMode
from scheduler.services import InvalidTransition
from scheduler.work import work_enqueue_on_commit

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
    found = _COMMITTED.match(image or "")
    if found is None:
        return
    reference = image if ":" in image.rsplit("/", 1)[-1] else f"{image}:latest"
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


def _check_spec(instance: Instance, spec: dict) -> None:
    if spec["launch_mode"] not in LaunchMode.values:
        raise ValidationError({"launch_mode": f"Choose one of {', '.join(LaunchMode.values)}."})
    validate_launch(
        image=spec["image"],
        env=dict(spec["env"]),
        ports=[],
        entrypoint=spec["entrypoint"],
        args=list(spec["args"]),
    )
    registry_check(image=spec["image"], allow_private=instance.machine.allow_private_registries)
    committed_image_check(team=instance.team, machine_id=instance.machine_id, image=spec["image"])


def rental_new_version(*, instance: Instance, changes: dict, by: str, reason: str = "") -> Instance:
    """Run the instance's spec with ``changes`` as its next version: the current container
    stops (and is kept), a new one starts on the same GPUs. 400 when nothing changes or the
    spec is refused, 409 when the instance is not running or exited."""
    current = scheduler.version_spec(instance)
    spec = {**current, **changes}
    if spec == current:
        raise ValidationError({"non_field_errors": "This is the current spec: nothing to change."})
    _check_spec(instance, spec)
    _within_period(instance)
    changed = sorted(name for name in spec if spec[name] != current[name])
    reason = reason or f"Version {instance.version + 1}: changed {', '.join(changed)}"
    scheduler.instance_version_prepare(instance_id=instance.pk)
    with transaction.atomic():
        moved = scheduler.instance_version_begin(
            instance_id=instance.pk,
            expected_version=instance.version,
            changes={name: spec[name] for name in changed},
            by=by,
            reason=reason,
        )
        work_enqueue_on_commit(instance.pk, InstanceState.LAUNCHING)
    return moved


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
        reason=f"Version {instance.version + 1}: rolled back to version {number}",
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
