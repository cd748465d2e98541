"""Versions of an instance's spec: a change (PATCH, a rollback) runs a new container
``<name>-<n>`` on the same machine and GPUs; the previous one is stopped and kept as history
(``InstanceVersion``) until it is deleted or the instance is destroyed.

The previous container is stopped over SSH first, outside any transaction (a slow host holds
no row locks); then one transaction records it and moves the instance to launching with the
new spec, and the launch work (pull, run, launch-mode check) is the usual launcher's.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from hosts.runtime import CommandFailed, DockerHost
from scheduler.models import (
    VERSION_FIELDS,
    Instance,
    InstanceState,
    InstanceVersion,
    version_container_name,
)
from scheduler.services.containers import container_gone_or_stopped, existing_container
from scheduler.services.errors import InvalidTransition
from scheduler.services.transitions import instance_transition

# A new version starts from these (the GPUs are still held; the container is stopped first).
VERSIONABLE_STATES = {InstanceState.RUNNING, InstanceState.EXITED}


def version_spec(instance: Instance) -> dict:
    return {name: getattr(instance, name) for name in VERSION_FIELDS}


def _versionable(instance: Instance) -> None:
    if instance.state not in VERSIONABLE_STATES:
        raise InvalidTransition(
            f"An instance that is {instance.state} cannot get a new version; "
            "only a running or exited one can."
        )


def instance_version_prepare(*, instance_id: int) -> Instance:
    """Stop the current container (it is kept). Raises what the host raised."""
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    _versionable(instance)
    container_gone_or_stopped(DockerHost(instance.machine), instance, remove=False)
    return instance


@transaction.atomic
def instance_version_begin(
    *, instance_id: int, expected_version: int, changes: dict, by: str, reason: str
) -> Instance:
    """Record the current version as history and launch the next with ``changes``. The
    caller queues the launch work in the same transaction."""
    instance = Instance.objects.select_for_update().get(pk=instance_id)
    _versionable(instance)
    if instance.version != expected_version:
        raise InvalidTransition("The instance got another version meanwhile; look again.")
    InstanceVersion.objects.create(
        instance=instance,
        number=instance.version,
        spec=version_spec(instance),
        container_id=instance.container_id,
        created_by=instance.version_by,
        created_at=instance.version_at or instance.created_at,
    )
    now = timezone.now()
    return instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.LAUNCHING,
        reason=reason,
        only_from=VERSIONABLE_STATES,
        version=instance.version + 1,
        version_at=now,
        version_by=by[:150],
        container_id="",
        exit_code=None,
        progress=0,
        work_due_at=now,
        attempts=0,
        **{name: value for name, value in changes.items() if name in VERSION_FIELDS},
    )


def instance_version_delete(*, instance_id: int, number: int) -> None:
    """Remove an earlier version's container from the host and forget it."""
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    if number == instance.version:
        raise InvalidTransition("This is the current version; roll back to another first.")
    version = InstanceVersion.objects.filter(instance=instance, number=number).first()
    if version is None:
        raise InvalidTransition(f"There is no version {number} to delete.")
    DockerHost(instance.machine).remove(
        version.container_id or version_container_name(instance, number)
    )
    version.delete()


def versions_remove_containers(host: DockerHost, instance: Instance) -> None:
    """Remove every earlier version's container (the instance is being destroyed); one that
    is gone already counts as removed. Raises what the host raised."""
    for version in InstanceVersion.objects.filter(instance=instance):
        ref = version.container_id or version_container_name(instance, version.number)
        try:
            host.remove(ref)
        except CommandFailed:
            if existing_container(host, ref):
                raise
