"""Level-triggered reconcile of a machine: instances follow their containers, leftovers stop."""

from __future__ import annotations

import logging
import re
import uuid
from datetime import datetime, timedelta

from django.db.models import OuterRef, Q, QuerySet

from hosts.models import Machine, MachineStatus
from hosts.runtime import CommandFailed, DockerHost, HostUnreachable
from hosts.runtime.docker_host import ContainerState
from hosts.services import machine_container_killed, offline_bound_seconds
from scheduler.models import GPU_HOLDING_STATES, Instance, InstanceState
from scheduler.services.allocations import (
    holding_gpus,
    instance_holds_gpus,
    live_gpu_allocations,
    live_gpu_slices,
)
from scheduler.services.container_spec import extra_container_labels
from scheduler.services.expiry import LIVE_STATES
from scheduler.services.start import start_under_way
from scheduler.services.transitions import instance_transition

logger = logging.getLogger(__name__)


def machine_reconcile(*, machine_id: int) -> int:
    """Compare the machine's platform containers (one ``docker ps``) with our instances.

    Running and exited instances follow their containers. Containers of instances that are
    no longer supposed to run (stopped, failed, expired, destroyed — say, their host was
    unreachable when they ended) are stopped, or removed for destroyed ones, and GPUs those
    instances still hold are released once their container is seen stopped. A start under way
    (``start_under_way``) is not one of them, unless its worker died (START_LEASE).

    Returns how many instances changed state or gave GPUs back.
    """
    machine = Machine.objects.get(pk=machine_id)
    host = DockerHost(machine)
    listed = host.list_platform_containers(labels=extra_container_labels())
    containers = {c.name: c for c in listed}
    changed = _remove_leftovers(host, listed)
    watched = Instance.objects.filter(machine=machine, state__in=FOLLOWED_STATES)
    for instance in watched:
        container = containers.get(instance.container_name)
        if instance.state == InstanceState.UNKNOWN and container is not None:
            changed += _resolve_unknown(host, instance, container)
        else:
            changed += _follow_container(instance, container)
    running_uuids = [
        c.instance for c in containers.values() if (c.running or c.paused) and c.instance
    ]
    ended = (
        Instance.objects.filter(machine=machine)
        # Destroying is its own worker's to finish; the live states are followed above, and
        # destroyed ones' containers are leftovers, removed above.
        .exclude(state__in=[*LIVE_STATES, InstanceState.DESTROYING, InstanceState.DESTROYED])
        .filter(Q(uuid__in=running_uuids) | holding_gpus(instance=OuterRef("pk")))
        # A start under way has its GPUs and (re)started container on purpose; stopping it and
        # freeing them would leave it running on GPUs someone else can rent.
        .exclude(start_under_way())
    )
    for instance in ended:
        changed += _end_leftover_container(host, instance, containers.get(instance.container_name))
    return changed


def _remove_leftovers(host: DockerHost, listed: list[ContainerState]) -> int:
    """Remove the containers of destroyed instances (any of their versions, running or
    exited), logging each with its reason; one Docker refuses is tried again at the next
    pass. A platform container whose instance this database does not know is reported, not
    removed: it may be another installation's on a shared host, or a renter's whose rows a
    restored backup lost, and removing it would destroy data we cannot account for."""
    uuids = {c.instance for c in listed if _is_uuid(c.instance)}
    states = {
        str(uuid): state
        for uuid, state in Instance.objects.filter(uuid__in=uuids).values_list("uuid", "state")
    }
    removed = 0
    for container in listed:
        state = states.get(container.instance)
        if state is None:
            logger.warning(
                "container %s on machine %s belongs to no instance of this platform (%s); left "
                "for the provider",
                container.name, host.machine.pk, container.instance or "no instance label",
            )  # fmt: skip
            continue
        if state != InstanceState.DESTROYED:
            continue
        try:
            host.remove(container.id)
        except (CommandFailed, HostUnreachable) as error:
            logger.warning("could not remove leftover container %s: %s", container.name, error)
            continue
        logger.warning(
            "removed leftover container %s (%s) on machine %s: its instance %s was destroyed",
            container.name, container.state, host.machine.pk, container.instance,
        )  # fmt: skip
        removed += 1
    return removed


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


# Instances whose state follows their container's.
FOLLOWED_STATES = [
    InstanceState.RUNNING,
    InstanceState.PAUSED,
    InstanceState.EXITED,
    InstanceState.UNKNOWN,
]


def _resolve_unknown(host: DockerHost, instance: Instance, container: ContainerState) -> bool:
    """Its host answers again: say what became of the container. Running or paused, it goes
    on. Stopped while the host could not be reached (Docker restarted, the host rebooted),
    the host killed it, not the renter's command: it is started again on its GPUs, which it
    kept. Stopped before that, it exited on its own."""
    if container.running or container.paused:
        to_state = InstanceState.RUNNING if container.running else InstanceState.PAUSED
        reason = f"Its host answers again; the container is {to_state}"
    elif _stopped_during_outage(host, instance, container):
        try:
            host.start(container.id)
        except (CommandFailed, HostUnreachable) as error:
            logger.warning("could not start instance %s again: %s", instance.pk, error)
            return False
        to_state = InstanceState.RUNNING
        reason = (
            f"Started again: the host stopped its container ({container.status}) while it "
            "could not be reached"
        )
    else:
        moved = instance_transition(
            instance_id=instance.pk,
            to_state=InstanceState.EXITED,
            reason=f"Its host answers again; the container had exited ({container.status})",
            only_from={InstanceState.UNKNOWN},
            exit_code=exit_code_of(container.status),
        )
        return moved is not None
    moved = instance_transition(
        instance_id=instance.pk,
        to_state=to_state,
        reason=reason,
        only_from={InstanceState.UNKNOWN},
        exit_code=None,
    )
    if moved is not None and reason.startswith("Started again"):
        machine_container_killed(machine_id=host.machine.pk, container=container.id, reason=reason)
    return moved is not None


def _stopped_during_outage(host: DockerHost, instance: Instance, container: ContainerState) -> bool:
    """Whether the container stopped after its host may already have stopped answering: from
    the longest a dead host stays unnoticed before the instance became unknown."""
    try:
        finished = _docker_time(host.inspect(container.id)["State"]["FinishedAt"])
    except (CommandFailed, HostUnreachable, KeyError, ValueError):
        return False
    unnoticed = timedelta(seconds=offline_bound_seconds())
    return finished is not None and finished >= instance.state_changed_at - unnoticed


def _docker_time(text: str) -> datetime | None:
    """Docker's RFC 3339 time with nanoseconds (``2026-11-27T02:31:13.215720123Z``); None for
    its zero time (never finished)."""
    if not text or text.startswith("0001-"):
        return None
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed)


def _follow_container(instance: Instance, container) -> bool:
    if container is not None and container.paused:
        # Paused by the renter (or by hand on the host): frozen, not exited.
        moved = None
        if instance.state == InstanceState.RUNNING:
            moved = instance_transition(
                instance_id=instance.pk,
                to_state=InstanceState.PAUSED,
                reason="The container was paused on the host",
                only_from={InstanceState.RUNNING},
            )
    elif container is None:
        moved = instance_transition(
            instance_id=instance.pk,
            to_state=InstanceState.FAILED,
            reason="The container disappeared from the host",
            only_from={instance.state},
            container_stopped=True,  # `docker ps` answered, without it
        )
        if moved is not None:
            machine_container_killed(
                machine_id=instance.machine_id,
                container=instance.container_id or f"instance {instance.pk}",
                reason="the container disappeared from the host",
            )
    elif container.running and instance.state in (InstanceState.EXITED, InstanceState.PAUSED):
        moved = instance_transition(
            instance_id=instance.pk,
            to_state=InstanceState.RUNNING,
            reason="The container is running again",
            only_from={InstanceState.EXITED, InstanceState.PAUSED},
            exit_code=None,
        )
    elif not container.running and instance.state in (
        InstanceState.RUNNING,
        InstanceState.PAUSED,
    ):
        moved = instance_transition(
            instance_id=instance.pk,
            to_state=InstanceState.EXITED,
            reason=f"The container exited ({container.status})",
            only_from={InstanceState.RUNNING, InstanceState.PAUSED},
            exit_code=exit_code_of(container.status),
        )
    else:
        moved = None
    return moved is not None


# `docker ps` shows a stopped container's status as "Exited (137) 2 seconds ago".
EXIT_STATUS = re.compile(r"^Exited \((-?\d+)\)")


def exit_code_of(status: str) -> int | None:
    """The exit code in a ``docker ps`` status, or None when it shows none (a container that
    was created but never started, or is dead)."""
    match = EXIT_STATUS.match(status or "")
    if match is None:
        return None
    code = int(match.group(1))
    return code if -32768 <= code <= 32767 else None


def _end_leftover_container(host: DockerHost, instance: Instance, container) -> bool:
    """Stop (or, for a destroyed instance, remove) a container that should not be running,
    then give back the GPUs its instance kept for it. Same-state transition: an event with
    the reason, nothing else changes."""
    if container is not None and (container.running or instance.state == InstanceState.DESTROYED):
        try:
            if instance.state == InstanceState.DESTROYED:
                host.remove(container.id)
            else:
                host.stop(container.id)
        except CommandFailed:
            logger.warning("could not stop leftover container of %s", instance, exc_info=True)
            return False
        what = "removed" if instance.state == InstanceState.DESTROYED else "stopped"
        reason = f"Its container was still running on the host; {what} it"
    else:
        reason = "Its container is confirmed stopped"
    if instance_holds_gpus(instance):
        reason += "; its GPUs are free again"
    moved = instance_transition(
        instance_id=instance.pk,
        to_state=instance.state,
        reason=reason,
        only_from={instance.state},
        container_stopped=True,  # listed stopped by `docker ps`, or stopped/removed just now
    )
    return moved is not None


def machines_needing_reconcile() -> QuerySet[Machine]:
    """Online machines with containers to watch: live instances, or ended ones still holding
    GPUs because their container was not confirmed stopped."""
    live = Instance.objects.filter(state__in=FOLLOWED_STATES).values("machine_id")
    unconfirmed = (
        live_gpu_allocations()
        .exclude(instance__state__in=GPU_HOLDING_STATES)
        .values("instance__machine_id")
    )
    unconfirmed_slices = (
        live_gpu_slices()
        .exclude(instance__state__in=GPU_HOLDING_STATES)
        .values("instance__machine_id")
    )
    return Machine.objects.filter(status=MachineStatus.ONLINE).filter(
        Q(pk__in=live) | Q(pk__in=unconfirmed) | Q(pk__in=unconfirmed_slices)
    )
