"""Versions of an instance's spec: a change (PATCH, a rollback) runs a new container
``<name>-<n>`` on the same machine and GPUs; the previous one is stopped and kept as history
(``InstanceVersion``) until it is deleted or the instance is destroyed.

The previous container is stopped over SSH first, outside any transaction (a slow host holds
no row locks); then one transaction records it and moves the instance to launching with the
new spec, and the launch work (pull, run, launch-mode check) is the usual launcher's.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from hosts.models import Machine
from hosts.runtime import CommandFailed, DockerHost, HostKeyMismatch, HostUnreachable
from scheduler.models import (
    VERSION_FIELDS,
    GpuAllocation,
    Instance,
    InstanceState,
    InstanceVersion,
    PortAllocation,
    version_container_name,
)
from scheduler.services.allocations import FreeCapacity, allocations_write
from scheduler.services.containers import (
    container_gone_or_stopped,
    container_removed,
    existing_container,
    instance_container_ref,
)
from scheduler.services.errors import InvalidTransition, NoCapacity
from scheduler.services.transitions import instance_transition

logger = logging.getLogger(__name__)

# A new version starts from these (the GPUs are still held; the container is stopped first).
VERSIONABLE_STATES = {InstanceState.RUNNING, InstanceState.EXITED}


def version_spec(instance: Instance) -> dict:
    return {
        **{name: getattr(instance, name) for name in VERSION_FIELDS},
        "ports": sorted(
            PortAllocation.objects.filter(instance=instance, released_at=None).values_list(
                "container_port", flat=True
            )
        ),
    }


def instance_ports_set(
    *, instance: Instance, container_ports: list[int], host_ports: dict[int, int] | None = None
) -> None:
    """The instance publishes ``container_ports`` from now on: a port it keeps keeps its host
    port, one it drops is released, a new one gets a free host port of the machine's range
    (or the one ``host_ports`` names, which must be free). NoCapacity (nothing written) when
    the range is full or a named host port was taken. The caller's transaction holds."""
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=instance.machine_id)
        live = {
            allocation.container_port: allocation
            for allocation in PortAllocation.objects.filter(instance=instance, released_at=None)
        }
        wanted = list(dict.fromkeys(container_ports))
        dropped = [a.pk for port, a in live.items() if port not in wanted]
        PortAllocation.objects.filter(pk__in=dropped).update(released_at=timezone.now())
        added = [port for port in wanted if port not in live]
        if not added:
            return
        if host_ports is None:
            _, pairs = FreeCapacity([machine]).take(machine.pk, 0, added)
        else:
            used = FreeCapacity([machine]).used_ports[machine.pk]
            pairs = [(port, host_ports.get(port)) for port in added]
            if any(host is None or host in used for _, host in pairs):
                raise NoCapacity("the host ports it published were taken meanwhile")
        allocations_write([(instance, [], pairs, None)])


def next_version_number(instance: Instance) -> int:
    """The number the instance's next version gets: past every version so far, a failed one
    included (its number is history, and money keyed by it must not be reused)."""
    last = InstanceVersion.objects.filter(instance=instance).aggregate(last=Max("number"))["last"]
    return max(instance.version, last or 0) + 1


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
    container_gone_or_stopped(
        DockerHost(instance.machine), instance_container_ref(instance), remove=False
    )
    return instance


@transaction.atomic
def instance_version_begin(
    *,
    instance_id: int,
    expected_version: int,
    changes: dict,
    by: str,
    reason: str,
    current_spec: dict | None = None,
) -> Instance:
    """Record the current version as history and launch the next with ``changes``. The
    caller queues the launch work in the same transaction; ``current_spec`` is the current
    version's spec as read before the caller changed its ports in this transaction."""
    instance = Instance.objects.select_for_update().get(pk=instance_id)
    _versionable(instance)
    if instance.version != expected_version:
        raise InvalidTransition("The instance got another version meanwhile; look again.")
    number = next_version_number(instance)
    InstanceVersion.objects.create(
        instance=instance,
        number=instance.version,
        spec=current_spec or version_spec(instance),
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
        version=number,
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
    if not version.failure:  # a failed version has no container
        DockerHost(instance.machine).remove(
            version.container_id or version_container_name(instance, number)
        )
    version.delete()


def versions_remove_containers(host: DockerHost, instance: Instance) -> None:
    """Remove every earlier version's container (the instance is being destroyed); one that
    is gone already counts as removed. Raises what the host raised."""
    for version in InstanceVersion.objects.filter(instance=instance, failure=""):
        ref = version.container_id or version_container_name(instance, version.number)
        try:
            host.remove(ref)
        except CommandFailed:
            if existing_container(host, ref):
                raise


def _found_or_named(host: DockerHost, ref: str) -> str:
    """The id of the container ``ref`` just started, or its name when Docker does not say."""
    try:
        return existing_container(host, ref) or ref
    except (CommandFailed, HostUnreachable, HostKeyMismatch):
        return ref


def instance_version_fall_back(
    host: DockerHost, instance: Instance, failure: str
) -> Instance | None:
    """A new version whose launch failed on a host that answered: the version before it runs
    again, in its own container, on its GPUs, and the failed one is kept as history with
    ``failure`` (the instance's event and status say why). None, changing nothing, when there
    is no earlier version to run (a first launch) or it cannot run again (its container is
    gone, its GPUs were rented meanwhile): the launch then fails as any does.

    Called by the launcher under its lease, after it removed the failed container."""
    previous = (
        InstanceVersion.objects.filter(instance=instance, failure="", number__lt=instance.version)
        .order_by("-number")
        .first()
    )
    if previous is None:
        return None
    ref = previous.container_id or version_container_name(instance, previous.number)
    failed_spec = version_spec(instance)  # before its ports go back to the earlier ones
    try:
        _gpus_back(instance, int(previous.spec.get("gpu_count", instance.gpu_count)))
        if "ports" in previous.spec:
            _ports_back(instance, list(previous.spec["ports"]))
        host.start(ref)  # outside any transaction: a slow host holds no row locks
    except (NoCapacity, CommandFailed, HostUnreachable, HostKeyMismatch) as error:
        logger.warning(
            "instance %s: version %s cannot run again: %s", instance.pk, previous.number, error
        )
        return None
    container_id = previous.container_id or _found_or_named(host, ref)
    with transaction.atomic():
        current = Instance.objects.select_for_update().get(pk=instance.pk)
        failed_number = current.version
        moved = instance_transition(
            instance_id=instance.pk,
            to_state=InstanceState.RUNNING,
            reason=f"Version {failed_number} did not start ({failure[:300]}); "
            f"version {previous.number} runs again",
            only_from={InstanceState.LAUNCHING},
            version=previous.number,
            version_at=previous.created_at,
            version_by=previous.created_by,
            container_id=container_id[:80],
            exit_code=None,
            progress=100,
            **{name: previous.spec[name] for name in VERSION_FIELDS if name in previous.spec},
        )
        if moved is None:
            # Stopped or destroyed meanwhile: that work acts on the current version's name,
            # so the container started here is stopped again (it stays the earlier version).
            transaction.on_commit(lambda: container_removed(host, ref, stop_only=True))
            return None
        InstanceVersion.objects.create(
            instance=moved,
            number=failed_number,
            spec=failed_spec,
            failure=failure[:500],
            created_by=current.version_by,
            created_at=current.version_at or current.created_at,
        )
        previous.delete()  # it is the current version again
    return moved


def _ports_back(instance: Instance, container_ports: list[int]) -> None:
    """The earlier container's published ports: the host ports it was made with (the ones
    last released for each of its container ports), which must still be free."""
    released = (
        PortAllocation.objects.filter(instance=instance)
        .exclude(released_at=None)
        .order_by("released_at", "pk")
        .values_list("container_port", "host_port")
    )
    instance_ports_set(
        instance=instance, container_ports=container_ports, host_ports=dict(released)
    )


def _gpus_back(instance: Instance, count: int) -> None:
    """The GPUs of the version that runs again: the failed version's extra GPUs go back (the
    newest allocations), or the GPUs it gave back are taken again, the very ones the earlier
    container is pinned to (NoCapacity when someone rented them meanwhile). A slice keeps
    its slice (its count never changes)."""
    if instance.is_slice:
        return
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=instance.machine_id)
        held = GpuAllocation.objects.filter(instance=instance, released_at=None)
        now_held = held.count()
        if count < now_held:
            newest = held.order_by("-created_at", "-pk").values_list("pk", flat=True)
            GpuAllocation.objects.filter(pk__in=list(newest[: now_held - count])).update(
                released_at=timezone.now()
            )
        elif count > now_held:
            released = (
                GpuAllocation.objects.filter(instance=instance)
                .exclude(released_at=None)
                .order_by("-released_at", "-pk")
                .values_list("gpu_id", flat=True)
            )
            wanted = list(dict.fromkeys(released))[: count - now_held]
            free = set(FreeCapacity([machine]).free_gpu_ids[machine.pk])
            if len(wanted) < count - now_held or not set(wanted) <= free:
                raise NoCapacity("the GPUs it ran on were rented meanwhile")
            GpuAllocation.objects.bulk_create(
                [GpuAllocation(instance=instance, gpu_id=gpu_id) for gpu_id in wanted]
            )
