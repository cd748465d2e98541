"""Writes of the scheduler: allocate GPUs and ports, move instances through their states, and
drive containers on the hosts (through hosts.runtime, over SSH).

Allocation happens inside the caller's transaction with the machine row locked, so two renters
racing for the last GPU are serialized; the partial unique constraints on the allocation tables
are the backstop. Container commands never run inside a transaction: a slow host must not hold
row locks, and a rolled-back rental must not leave a container behind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from hosts.models import Gpu, Machine
from hosts.ports import pick_free_ports
from hosts.runtime import CommandFailed, ContainerSpec, DockerHost, HostKeyMismatch, HostUnreachable
from scheduler.models import (
    GPU_HOLDING_STATES,
    TRANSITIONS,
    GpuAllocation,
    Instance,
    InstanceEvent,
    InstanceState,
    LaunchMode,
    PortAllocation,
)
from scheduler.signals import instance_progress, instance_state_changed

logger = logging.getLogger(__name__)

SSH_CONTAINER_PORT = 22
JUPYTER_CONTAINER_PORT = 8888


class SchedulerError(Exception):
    http_status = 409
    error_code = "conflict"


class NoCapacity(SchedulerError):
    """Not enough free GPUs or host ports on the machine (someone else took them)."""

    error_code = "gpus_taken"


class InvalidTransition(SchedulerError):
    error_code = "invalid_state"


# --- allocation ---------------------------------------------------------------------------


def live_gpu_allocations() -> QuerySet[GpuAllocation]:
    return GpuAllocation.objects.filter(released_at=None)


def free_gpus(machine: Machine) -> QuerySet[Gpu]:
    """Present GPUs of the machine that no live allocation holds."""
    taken = live_gpu_allocations().filter(gpu=OuterRef("pk"))
    return machine.gpus.filter(present=True).exclude(Exists(taken)).order_by("index")


def allocation_create(
    *, machine: Machine, instance: Instance, gpu_count: int, container_ports: list[int]
) -> tuple[list[Gpu], list[PortAllocation]]:
    """Take ``gpu_count`` free GPUs and one host port per container port.

    The caller holds the machine row lock (``select_for_update``) in its transaction.
    """
    gpus = list(free_gpus(machine)[:gpu_count])
    if len(gpus) < gpu_count:
        raise NoCapacity(
            f"Only {len(gpus)} GPU(s) of machine {machine.pk} are free now; "
            f"{gpu_count} were asked for."
        )
    used = set(
        PortAllocation.objects.filter(machine=machine, released_at=None).values_list(
            "host_port", flat=True
        )
    )
    host_ports = pick_free_ports(
        machine.port_range_start, machine.port_range_end, used, len(container_ports)
    )
    if len(host_ports) < len(container_ports):
        raise NoCapacity(f"Machine {machine.pk} has no free host ports left.")
    try:
        with transaction.atomic():  # savepoint: a constraint violation is a clean 409
            GpuAllocation.objects.bulk_create(
                [GpuAllocation(instance=instance, gpu=gpu) for gpu in gpus]
            )
            ports = PortAllocation.objects.bulk_create(
                [
                    PortAllocation(
                        instance=instance, machine=machine, host_port=hp, container_port=cp
                    )
                    for cp, hp in zip(container_ports, host_ports, strict=True)
                ]
            )
    except IntegrityError as error:
        raise NoCapacity("The GPUs were taken by another rental a moment ago.") from error
    return gpus, ports


def gpu_allocation_release(*, instance: Instance) -> int:
    return live_gpu_allocations().filter(instance=instance).update(released_at=timezone.now())


def allocation_release_all(*, instance: Instance) -> None:
    now = timezone.now()
    live_gpu_allocations().filter(instance=instance).update(released_at=now)
    PortAllocation.objects.filter(instance=instance, released_at=None).update(released_at=now)


def gpu_allocation_reclaim(*, instance: Instance) -> list[Gpu]:
    """Take back the GPUs a stopped instance had (its container is pinned to them).

    Raises NoCapacity when another rental holds one of them now. Locks the machine row.
    """
    Machine.objects.select_for_update().get(pk=instance.machine_id)
    last = (
        GpuAllocation.objects.filter(instance=instance)
        .exclude(released_at=None)
        .order_by("-released_at")
        .first()
    )
    if last is None:
        raise NoCapacity("This instance holds no GPUs to take back.")
    gpu_ids = list(
        GpuAllocation.objects.filter(instance=instance, released_at=last.released_at).values_list(
            "gpu_id", flat=True
        )
    )
    if live_gpu_allocations().filter(gpu_id__in=gpu_ids).exists():
        raise NoCapacity("Its GPUs are rented by someone else now; try again later.")
    gpus = list(Gpu.objects.filter(pk__in=gpu_ids, present=True).order_by("index"))
    if len(gpus) != len(gpu_ids):
        raise NoCapacity("One of its GPUs is missing from the machine.")
    try:
        with transaction.atomic():
            GpuAllocation.objects.bulk_create(
                [GpuAllocation(instance=instance, gpu=gpu) for gpu in gpus]
            )
    except IntegrityError as error:
        raise NoCapacity("Its GPUs were taken a moment ago.") from error
    return gpus


def instance_gpu_uuids(instance: Instance) -> list[str]:
    return list(
        live_gpu_allocations()
        .filter(instance=instance)
        .order_by("gpu__index")
        .values_list("gpu__uuid", flat=True)
    )


# --- state machine ------------------------------------------------------------------------


def instance_transition(
    *, instance_id: int, to_state: str, reason: str, only_from: set[str] | None = None, **fields
) -> Instance | None:
    """Move an instance to ``to_state`` and record why; publish on commit.

    Returns None (and changes nothing) when the instance is not in ``only_from`` — the way a
    re-delivered or late task learns someone else already moved it on.
    """
    with transaction.atomic():
        instance = Instance.objects.select_for_update().get(pk=instance_id)
        from_state = instance.state
        if only_from is not None and from_state not in only_from:
            return None
        if to_state != from_state and to_state not in TRANSITIONS[from_state]:
            raise InvalidTransition(f"An instance that is {from_state} cannot become {to_state}.")
        instance.state = to_state
        instance.status_message = reason[:500]
        instance.state_changed_at = timezone.now()
        for name, value in fields.items():
            setattr(instance, name, value)
        instance.save()
        InstanceEvent.objects.create(
            instance=instance, from_state=from_state, to_state=to_state, reason=reason[:500]
        )
        if to_state not in GPU_HOLDING_STATES:
            gpu_allocation_release(instance=instance)
        if to_state == InstanceState.DESTROYED:
            allocation_release_all(instance=instance)
        payload = {
            "instance_id": instance.pk,
            "team_id": instance.team_id,
            "machine_id": instance.machine_id,
            "from_state": from_state,
            "to_state": to_state,
            "reason": reason,
        }
        transaction.on_commit(
            lambda: instance_state_changed.send_robust(sender=Instance, **payload)
        )
    return instance


def instance_report_progress(*, instance: Instance, progress: int, message: str) -> None:
    Instance.objects.filter(pk=instance.pk, state=InstanceState.LAUNCHING).update(
        progress=progress, status_message=message[:500]
    )
    instance_progress.send_robust(
        sender=Instance,
        instance_id=instance.pk,
        team_id=instance.team_id,
        progress=progress,
        message=message,
    )


# --- containers ---------------------------------------------------------------------------


def extra_container_labels() -> dict[str, str]:
    return dict(getattr(settings, "CONTAINER_EXTRA_LABELS", {}))


def container_spec_for(instance: Instance, *, ssh_keys: list[str] | None = None) -> ContainerSpec:
    """The container an instance runs: its units' limits, pinned GPUs, published ports."""
    machine = instance.machine
    n = instance.gpu_count
    env = dict(instance.env)
    args = list(instance.args)
    entrypoint = instance.entrypoint or None
    if instance.launch_mode == LaunchMode.SSH:
        env["GPUMKT_SSH_AUTHORIZED_KEYS"] = "\n".join(ssh_keys or [])
        if not args and not entrypoint:
            entrypoint, args = "sh", ["-c", SSH_BOOTSTRAP]
    elif instance.launch_mode == LaunchMode.JUPYTER:
        env["JUPYTER_TOKEN"] = instance.jupyter_token
        if not args and not entrypoint:
            entrypoint, args = "sh", ["-c", JUPYTER_BOOTSTRAP]
    ports = [
        (p.container_port, p.host_port, p.protocol)
        for p in instance.port_allocations.filter(released_at=None).order_by("container_port")
    ]
    labels = {
        "gpumkt.instance": str(instance.uuid),
        "gpumkt.team": str(instance.team_id),
        **extra_container_labels(),
    }
    return ContainerSpec(
        name=instance.container_name,
        image=instance.image,
        labels=labels,
        env=env,
        ports=ports,
        cpus=round(machine.unit_cpus * n, 2),
        memory_mb=machine.unit_memory_mb * n,
        shm_mb=machine.unit_shm_mb * n,
        gpu_uuids=instance_gpu_uuids(instance),
        entrypoint=entrypoint,
        args=args,
    )


# Launch modes for images that bring their own sshd / Jupyter. The keys arrive in an env var,
# never pasted into a command line.
SSH_BOOTSTRAP = (
    'mkdir -p /root/.ssh && printf "%s\\n" "$GPUMKT_SSH_AUTHORIZED_KEYS" '
    "> /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys; "
    "if command -v sshd >/dev/null; then mkdir -p /run/sshd; exec $(command -v sshd) -D; "
    "else echo 'image has no sshd; keeping the container up'; exec sleep 2147483647; fi"
)
JUPYTER_BOOTSTRAP = (
    "if command -v jupyter >/dev/null; then exec jupyter lab --ip=0.0.0.0 --port=8888 "
    '--allow-root --no-browser --ServerApp.token="$JUPYTER_TOKEN"; '
    "else echo 'image has no jupyter; keeping the container up'; exec sleep 2147483647; fi"
)


@dataclass(frozen=True)
class LaunchOutcome:
    instance_id: int
    state: str
    container_id: str = ""


def instance_launch(
    *,
    instance_id: int,
    ssh_keys: list[str] | None = None,
    registry_credentials: tuple[str, str] | None = None,
) -> LaunchOutcome:
    """Start the instance's container on its machine; idempotent.

    The container name is derived from the instance, so a second run of this (a re-delivered
    task, a worker killed mid-way) finds the container the first one made and adopts it
    instead of starting another.
    """
    instance = Instance.objects.select_related("machine").filter(pk=instance_id).first()
    if instance is None or instance.state != InstanceState.LAUNCHING:
        return LaunchOutcome(instance_id, instance.state if instance else "gone")
    first_attempt = instance.launch_attempts == 0
    Instance.objects.filter(pk=instance_id).update(launch_attempts=instance.launch_attempts + 1)
    host = DockerHost(instance.machine)
    try:
        spec = container_spec_for(instance, ssh_keys=ssh_keys)
        # Only a retry can find a container an earlier attempt made (attempts are counted
        # before `docker run`), so the first attempt skips that look-up.
        existing = "" if first_attempt else _existing_container(host, instance.container_name)
        if existing:
            host.start(existing)  # a no-op when it is already running
            container_id = existing
        else:
            container_id = _run_pulling_if_needed(host, instance, spec, registry_credentials)
    except (HostUnreachable, HostKeyMismatch):
        # Transient or operator-level: leave it launching; the task retries, and the
        # expiry sweep ends it if the machine never comes back.
        raise
    except (CommandFailed, ValueError) as error:
        # `docker run` can fail after creating the container (a port taken, say): remove it,
        # so a retry starts clean instead of adopting a broken container.
        _remove_quietly(host, instance.container_name)
        moved = instance_transition(
            instance_id=instance_id,
            to_state=InstanceState.FAILED,
            reason=f"Launch failed: {error}",
            only_from={InstanceState.LAUNCHING},
        )
        return LaunchOutcome(instance_id, moved.state if moved else "unchanged")
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.RUNNING,
        reason="Container started" if not existing else "Container found running",
        only_from={InstanceState.LAUNCHING},
        container_id=container_id,
        progress=100,
    )
    if moved is None:
        # Destroyed or stopped while we were launching: do not leave a container behind.
        current = Instance.objects.get(pk=instance_id)
        if current.state in (InstanceState.DESTROYED, InstanceState.STOPPED):
            _remove_quietly(host, container_id, stop_only=current.state == InstanceState.STOPPED)
        return LaunchOutcome(instance_id, current.state, container_id)
    return LaunchOutcome(instance_id, moved.state, container_id)


def _run_pulling_if_needed(
    host: DockerHost,
    instance: Instance,
    spec: ContainerSpec,
    credentials: tuple[str, str] | None = None,
) -> str:
    """Run with the image as it is; pull (with progress) only when the host lacks it."""
    try:
        return host.run(spec, pull=False)
    except CommandFailed as error:
        if "No such image" not in error.stderr and "not found" not in error.stderr:
            raise
    _remove_quietly(host, instance.container_name)
    instance_report_progress(instance=instance, progress=5, message="Pulling image")
    try:
        host.pull(
            instance.image,
            progress_callback=lambda pct, msg: instance_report_progress(
                instance=instance, progress=5 + int(pct * 0.85), message=msg
            ),
            credentials=credentials,
        )
    except CommandFailed as error:
        raise CommandFailed(
            error.argv, error.exit_code, f"could not pull {instance.image}: {error.stderr}"
        ) from error
    instance_report_progress(instance=instance, progress=92, message="Starting container")
    return host.run(spec, pull=False)


def _existing_container(host: DockerHost, name: str) -> str:
    """The id of the container with this name, or "" when there is none."""
    try:
        return str(host.inspect(name).get("Id", ""))
    except CommandFailed:
        return ""


def _remove_quietly(host: DockerHost, container_id: str, *, stop_only: bool = False) -> None:
    try:
        if stop_only:
            host.stop(container_id)
        else:
            host.remove(container_id)
    except (CommandFailed, HostUnreachable):
        logger.warning("could not clean up container %s", container_id, exc_info=True)


def instance_stop(*, instance_id: int, reason: str = "Stopped by the renter") -> Instance:
    """Stop the container and give its GPUs back; its disk (and storage charge) stays."""
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    if (
        instance.state not in TRANSITIONS
        or InstanceState.STOPPED not in TRANSITIONS[instance.state]
    ):
        raise InvalidTransition(f"An instance that is {instance.state} cannot be stopped.")
    if instance.container_id:
        DockerHost(instance.machine).stop(instance.container_id)
    return instance_transition(
        instance_id=instance_id, to_state=InstanceState.STOPPED, reason=reason
    )


# States whose GPUs were given back, so starting must take them again.
RECLAIMING_STATES = (InstanceState.STOPPED, InstanceState.FAILED)


def instance_start(*, instance_id: int) -> Instance:
    """Take the GPUs back (409 if someone else has them) and start the container again."""
    with transaction.atomic():
        instance = (
            Instance.objects.select_for_update().select_related("machine").get(pk=instance_id)
        )
        if instance.state not in (*RECLAIMING_STATES, InstanceState.EXITED):
            raise InvalidTransition(f"An instance that is {instance.state} cannot be started.")
        if instance.state in RECLAIMING_STATES:
            gpu_allocation_reclaim(instance=instance)
    host = DockerHost(instance.machine)
    try:
        if instance.container_id:
            host.start(instance.container_id)
        else:
            instance_transition(
                instance_id=instance_id, to_state=InstanceState.LAUNCHING, reason="Relaunching"
            )
            instance_launch(instance_id=instance_id)
            return Instance.objects.get(pk=instance_id)
    except (CommandFailed, HostUnreachable):
        if instance.state in RECLAIMING_STATES:
            gpu_allocation_release(instance=instance)
        raise
    return instance_transition(
        instance_id=instance_id, to_state=InstanceState.RUNNING, reason="Started by the renter"
    )


def instance_destroy(*, instance_id: int, reason: str = "Destroyed by the renter") -> Instance:
    """Remove the container and its data, release every allocation."""
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    if instance.state == InstanceState.DESTROYED:
        return instance
    if instance.container_id:
        try:
            DockerHost(instance.machine).remove(instance.container_id)
        except CommandFailed as error:
            if "No such container" not in str(error):
                raise
    return instance_transition(
        instance_id=instance_id, to_state=InstanceState.DESTROYED, reason=reason
    )


def instance_expire(*, instance_id: int) -> Instance | None:
    """The contract's end: stop the container; data stays until the grace period ends."""
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    if instance.state in (InstanceState.EXPIRED, InstanceState.DESTROYED):
        return None
    if instance.container_id and instance.state in (InstanceState.RUNNING, InstanceState.LAUNCHING):
        try:
            DockerHost(instance.machine).stop(instance.container_id)
        except (CommandFailed, HostUnreachable):
            logger.warning("could not stop expired instance %s", instance_id, exc_info=True)
    return instance_transition(
        instance_id=instance_id, to_state=InstanceState.EXPIRED, reason="The rental period ended"
    )


def machine_reconcile(*, machine_id: int) -> int:
    """Compare the machine's platform containers (one ``docker ps``) with our instances.

    Returns how many instances changed state.
    """
    machine = Machine.objects.get(pk=machine_id)
    containers = {c.name: c for c in DockerHost(machine).list_platform_containers()}
    changed = 0
    watched = Instance.objects.filter(
        machine=machine, state__in=[InstanceState.RUNNING, InstanceState.EXITED]
    )
    for instance in watched:
        container = containers.get(instance.container_name)
        if container is None:
            moved = instance_transition(
                instance_id=instance.pk,
                to_state=InstanceState.FAILED,
                reason="The container disappeared from the host",
                only_from={instance.state},
            )
        elif container.running and instance.state == InstanceState.EXITED:
            moved = instance_transition(
                instance_id=instance.pk,
                to_state=InstanceState.RUNNING,
                reason="The container is running again",
                only_from={InstanceState.EXITED},
            )
        elif not container.running and instance.state == InstanceState.RUNNING:
            moved = instance_transition(
                instance_id=instance.pk,
                to_state=InstanceState.EXITED,
                reason=f"The container exited ({container.status})",
                only_from={InstanceState.RUNNING},
            )
        else:
            moved = None
        changed += moved is not None
    return changed
