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
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from hosts.models import Gpu, Machine
from hosts.ports import pick_free_ports
from hosts.runtime import (
    EXIT_DOCKER_ERROR,
    CommandFailed,
    ContainerSpec,
    DockerHost,
    HostKeyMismatch,
    HostUnreachable,
    ImageNotOnHost,
    check_registry,
    image_repository,
)
from scheduler import work as work_lease
from scheduler.models import (
    GPU_HOLDING_STATES,
    TRANSITIONS,
    GpuAllocation,
    Instance,
    InstanceEvent,
    InstanceState,
    LaunchMode,
    PortAllocation,
    PrivateRepository,
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
    *,
    instance_id: int,
    to_state: str,
    reason: str,
    only_from: set[str] | None = None,
    keep_gpus: bool = False,
    **fields,
) -> Instance | None:
    """Move an instance to ``to_state`` and record why; publish on commit.

    Returns None (and changes nothing) when the instance is not in ``only_from`` — the way a
    re-delivered or late task learns someone else already moved it on.

    Leaving the GPU-holding states gives the GPUs back, unless ``keep_gpus``: the caller could
    not confirm the container stopped (its host was unreachable), so renting those GPUs to
    someone else would put two renters on them. ``machine_reconcile`` releases them once it
    has seen the container stopped.
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
        if to_state not in GPU_HOLDING_STATES and not keep_gpus:
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
    """Show launch progress. Raises LaunchInterrupted when the instance is no longer launching
    (the renter stopped or destroyed it), so a long pull ends at its next progress line."""
    still_launching = Instance.objects.filter(pk=instance.pk, state=InstanceState.LAUNCHING).update(
        progress=progress, status_message=message[:500]
    )
    if not still_launching:
        raise LaunchInterrupted(f"instance {instance.pk} is no longer launching")
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
        # Recorded on the container as a label; Docker cannot cap a container's disk on most
        # storage drivers (see hosts.runtime.DISK_LABEL), so the page says it is not enforced.
        disk_gb=instance.disk_gb,
    )


# Launch modes for images that bring their own sshd / Jupyter. The keys arrive in an env var,
# never pasted into a command line. An image without the program exits with MISSING_PROGRAM
# and a line saying so, and the launch fails with that reason (instance_launch checks): a
# container that only sleeps behind an ssh line or a token URL would be a lie.
MISSING_PROGRAM = 78
MISSING_SSHD = "image has no sshd; use an image with an OpenSSH server installed"
MISSING_JUPYTER = "image has no jupyter; use an image with Jupyter installed"
SSH_BOOTSTRAP = (
    'mkdir -p /root/.ssh && printf "%s\\n" "$GPUMKT_SSH_AUTHORIZED_KEYS" '
    "> /root/.ssh/authorized_keys && chmod 700 /root/.ssh && chmod 600 /root/.ssh/authorized_keys; "
    "if command -v sshd >/dev/null; then mkdir -p /run/sshd /etc/ssh; "
    "ls /etc/ssh/ssh_host_*_key >/dev/null 2>&1 || ssh-keygen -A >&2; "
    "exec $(command -v sshd) -D -e; "
    f"else echo '{MISSING_SSHD}' >&2; exit {MISSING_PROGRAM}; fi"
)
JUPYTER_BOOTSTRAP = (
    "if command -v jupyter >/dev/null; then exec jupyter lab --ip=0.0.0.0 --port=8888 "
    '--allow-root --no-browser --ServerApp.token="$JUPYTER_TOKEN"; '
    f"else echo '{MISSING_JUPYTER}' >&2; exit {MISSING_PROGRAM}; fi"
)
# What a launch mode's bootstrap runs, and what a launch says when the image lacks it.
MODE_PROGRAMS = {
    LaunchMode.SSH: ("sshd", MISSING_SSHD),
    LaunchMode.JUPYTER: ("jupyter", MISSING_JUPYTER),
}


class LaunchModeUnavailable(ValueError):
    """The image cannot serve the launch mode (no sshd, no jupyter)."""


def _check_launch_mode(host: DockerHost, instance: Instance, container_id: str) -> None:
    """Raise LaunchModeUnavailable when the image lacks the mode's program.

    Asked inside the container (``command -v``), so the answer does not depend on how fast
    the bootstrap gets to its own check. A container that already exited tells by its exit
    code which of the two it was: the program missing, or the program dying at once. Asked
    with the renter's own command too: without the program the mode's line is no use.
    """
    if instance.launch_mode not in MODE_PROGRAMS:
        return
    program, missing = MODE_PROGRAMS[instance.launch_mode]
    found = host.exec(container_id, ["sh", "-c", f"command -v {program}"], timeout=30)
    if found.exit_code == 0:
        return
    state = host.inspect(container_id).get("State", {})
    if state.get("Running") or state.get("ExitCode") == MISSING_PROGRAM:
        raise LaunchModeUnavailable(missing)
    raise LaunchModeUnavailable(
        f"{program} exited at once (exit code {state.get('ExitCode')}); see the logs"
    )


@dataclass(frozen=True)
class WorkOutcome:
    """What a launch, stop or destroy came to: the instance's state afterwards, or "busy"
    (another worker holds the lease: try again after ``retry_after`` seconds), "retry" (the
    host did not answer: try again after ``retry_after``) or "gone"."""

    instance_id: int
    state: str
    container_id: str = ""
    retry_after: float = 0


class LaunchInterrupted(Exception):
    """The instance left launching (stopped, destroyed) while its launch was under way."""


# A launch whose host does not answer is tried this many times (about half an hour with the
# backoff in scheduler.work) before it fails and the rental ends.
MAX_LAUNCH_ATTEMPTS = 10


def _leased(instance_id: int, state: str, work) -> WorkOutcome:
    """Run ``work(token)`` holding the instance's lease for ``state``, renewed all along."""
    token = work_lease.lease_claim(instance_id=instance_id, state=state)
    if token is None:
        current = Instance.objects.filter(pk=instance_id).values_list("state", flat=True).first()
        if current != state:
            return WorkOutcome(instance_id, current or "gone")
        return WorkOutcome(instance_id, "busy", retry_after=work_lease.lease_left(instance_id))
    outcome = None
    try:
        with work_lease.Heartbeat(instance_id, token):
            outcome = work(token)
        return outcome
    finally:
        retry_in = round(outcome.retry_after) if outcome and outcome.state == "retry" else None
        work_lease.lease_release(instance_id=instance_id, token=token, retry_in=retry_in)


def _waiting_for_host(instance: Instance, what: str, error: Exception) -> WorkOutcome:
    """The host did not answer: say so on the instance and ask for a later try."""
    delay = work_lease.retry_delay(instance.attempts)
    message = (
        f"{what}: the host has not answered yet ({str(error)[:200]}); "
        f"try {instance.attempts}, the next in {delay} s"
    )
    Instance.objects.filter(pk=instance.pk, state=instance.state).update(
        status_message=message[:500]
    )
    instance_progress.send_robust(
        sender=Instance,
        instance_id=instance.pk,
        team_id=instance.team_id,
        progress=instance.progress,
        message=message,
    )
    return WorkOutcome(instance.pk, "retry", retry_after=delay)


def instance_launch(
    *,
    instance_id: int,
    ssh_keys: list[str] | None = None,
    registry_credentials: tuple[str, str] | None = None,
) -> WorkOutcome:
    """Start the instance's container on its machine; idempotent.

    Only the worker holding the lease touches the host; another gets "busy". The container
    name is derived from the instance, so a later attempt (a worker killed mid-way, its lease
    expired) finds the container the first one made and adopts it instead of starting another.
    """
    return _leased(
        instance_id,
        InstanceState.LAUNCHING,
        lambda token: _launch_leased(instance_id, token, ssh_keys, registry_credentials),
    )


def instance_launch_fail(*, instance_id: int, reason: str) -> WorkOutcome:
    """End a launch that cannot go on, for a reason found before any host was asked (its
    GPUs are freed and its rental settles, as for any failed launch)."""
    return _launch_failed(instance_id, reason)


def _launch_failed(instance_id: int, reason: str) -> WorkOutcome:
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.FAILED,
        reason=reason,
        only_from={InstanceState.LAUNCHING},
    )
    return WorkOutcome(instance_id, moved.state if moved else _state_of(instance_id))


def _state_of(instance_id: int) -> str:
    return Instance.objects.values_list("state", flat=True).get(pk=instance_id)


def _launch_leased(
    instance_id: int,
    token: str,
    ssh_keys: list[str] | None,
    registry_credentials: tuple[str, str] | None,
) -> WorkOutcome:
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    if instance.state != InstanceState.LAUNCHING:
        return WorkOutcome(instance_id, instance.state)
    # Attempts are counted when the lease is taken, so only a later attempt can find a
    # container an earlier one made; the first skips that look-up.
    first_attempt = instance.attempts == 1
    host = DockerHost(instance.machine)
    try:
        spec = container_spec_for(instance, ssh_keys=ssh_keys)
        existing = "" if first_attempt else _existing_container(host, instance.container_name)
        if existing:
            host.start(existing)  # a no-op when it is already running
            container_id = existing
        else:
            container_id = _run_pulling_if_needed(host, instance, spec, registry_credentials)
        _check_launch_mode(host, instance, container_id)
    except LaunchInterrupted:
        # Stopped or destroyed meanwhile: that work, waiting for this lease, stops or removes
        # the container by its name.
        return WorkOutcome(instance_id, _state_of(instance_id))
    except HostUnreachable as error:
        if instance.attempts >= MAX_LAUNCH_ATTEMPTS:
            return _launch_failed(
                instance_id,
                f"Launch failed: the host did not answer in {instance.attempts} tries ({error})",
            )
        return _waiting_for_host(instance, "Launching", error)
    except HostKeyMismatch as error:
        return _launch_failed(instance_id, f"Launch refused: {error}")
    except (CommandFailed, ValueError) as error:
        # `docker run` can fail after creating the container (a port taken, say): remove it,
        # so nothing is left behind the failed rental.
        _remove_quietly(host, instance.container_name)
        return _launch_failed(instance_id, f"Launch failed: {error}")
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.RUNNING,
        reason="Container started" if not existing else "Container found running",
        only_from={InstanceState.LAUNCHING},
        container_id=container_id,
        progress=100,
    )
    if moved is None:
        # It left launching while `docker run` ran. Stopping and destroying wait for this lease
        # and then act on the container by name; tell them its id too. Any other state holds
        # no GPUs, so the container must not run.
        Instance.objects.filter(pk=instance_id, container_id="").update(container_id=container_id)
        current = _state_of(instance_id)
        if current not in GPU_HOLDING_STATES:
            _remove_quietly(host, container_id, stop_only=current != InstanceState.DESTROYED)
        return WorkOutcome(instance_id, current, container_id)
    return WorkOutcome(instance_id, moved.state, container_id)


def _may_exist(error: CommandFailed) -> bool:
    """Whether a failed `docker run` may have left a container of its name: the daemon
    refused (exit 125: the name taken by an earlier launch's container, or a port taken after
    the container was made). The caller looks it up by name; Docker's wording is not read."""
    return error.exit_code == EXIT_DOCKER_ERROR


def _run_pulling_if_needed(
    host: DockerHost,
    instance: Instance,
    spec: ContainerSpec,
    credentials: tuple[str, str] | None = None,
) -> str:
    """Run with the image as it is; pull (with progress) only when the host lacks it, or
    when the image is private: given with a login, or of a repository some rental pulled
    here with one. Then it is always pulled with this rental's own login (or none), so a
    private image another team left on the machine runs only for those the registry admits.

    A container of this name appearing meanwhile (a launcher whose claim had expired, still
    at work) is adopted, never removed: it may be the one that is running.
    """
    repository = image_repository(spec.image)
    private = (
        credentials is not None
        or PrivateRepository.objects.filter(
            machine_id=instance.machine_id, repository=repository
        ).exists()
    )
    if not private:
        # Only a missing image is pulled: a command the image cannot run (exit 126/127,
        # ContainerDidNotStart) or any other refusal fails the launch with Docker's reason.
        try:
            return host.run(spec, pull=False)
        except ImageNotOnHost:
            pass
        except CommandFailed as error:
            if _may_exist(error):
                return _adopt(host, instance, error)
            raise
    # Checked again here, on the worker, right before the host speaks to the registry: the
    # registry's name may point somewhere else now than when the rental was made.
    check_registry(instance.image, allow_private=instance.machine.allow_private_registries)
    report = lambda pct, msg: instance_report_progress(  # noqa: E731
        instance=instance, progress=pct, message=msg
    )
    report(5, "Pulling image")
    if credentials is not None:
        # Recorded before the pull: a launch of another team checking while this one pulls
        # must already find the repository private.
        PrivateRepository.objects.get_or_create(
            machine_id=instance.machine_id, repository=repository
        )
    try:
        host.pull(
            instance.image,
            progress_callback=lambda pct, msg: report(5 + int(pct * 0.85), msg),
            credentials=credentials,
        )
    except CommandFailed as error:
        raise CommandFailed(
            error.argv, error.exit_code, f"could not pull {instance.image}: {error.stderr}"
        ) from error
    report(92, "Starting container")
    try:
        return host.run(spec, pull=False)
    except CommandFailed as error:
        if _may_exist(error):
            return _adopt(host, instance, error)
        raise


def _adopt(host: DockerHost, instance: Instance, error: CommandFailed) -> str:
    existing = _existing_container(host, instance.container_name)
    if not existing:
        raise error
    host.start(existing)
    return existing


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


def _container_gone_or_stopped(host: DockerHost, instance: Instance, *, remove: bool) -> None:
    """Stop (or remove) the instance's container, found by id or else by its name (a launch
    may have made it without recording the id). A container that does not exist counts as
    stopped. Raises HostUnreachable, HostKeyMismatch or CommandFailed when it cannot be known."""
    ref = instance.container_id or instance.container_name
    try:
        if remove:
            host.remove(ref)
        else:
            host.stop(ref)
    except CommandFailed:
        if _existing_container(host, ref):
            raise


def instance_stop_request(
    *, instance_id: int, reason: str = "Stop asked for by the renter"
) -> Instance:
    """Ask for a stop: the instance is stopping at once (its GPU time is no longer charged) and
    keeps its GPUs until a worker has seen the container stop (``instance_stop``)."""
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.STOPPING,
        reason=reason,
        only_from=STOPPABLE_STATES,
        work_due_at=timezone.now(),
        attempts=0,
    )
    if moved is None:
        state = _state_of(instance_id)
        raise InvalidTransition(f"An instance that is {state} cannot be stopped.")
    return moved


def instance_stop(*, instance_id: int) -> WorkOutcome:
    """The work of a stopping instance: stop its container, then give its GPUs back. Retried
    (with backoff) until the host confirms; its disk (and storage charge) stays."""

    def stop(token: str) -> WorkOutcome:
        instance = Instance.objects.select_related("machine").get(pk=instance_id)
        try:
            _container_gone_or_stopped(DockerHost(instance.machine), instance, remove=False)
        except (HostUnreachable, HostKeyMismatch, CommandFailed) as error:
            return _waiting_for_host(instance, "Stopping", error)
        moved = instance_transition(
            instance_id=instance_id,
            to_state=InstanceState.STOPPED,
            reason="Stopped: the container is stopped and its GPUs are free",
            only_from={InstanceState.STOPPING},
        )
        return WorkOutcome(instance_id, moved.state if moved else _state_of(instance_id))

    return _leased(instance_id, InstanceState.STOPPING, stop)


def instance_destroy_request(
    *, instance_id: int, reason: str = "Destroyed by the renter"
) -> Instance:
    """Ask for the container and its data to go: the instance is destroying at once (the
    rental ends and settles now) and keeps its GPUs until a worker has removed the container
    (``instance_destroy``). Asking again changes nothing."""
    with transaction.atomic():
        state = (
            Instance.objects.select_for_update().values_list("state", flat=True).get(pk=instance_id)
        )
        if state in (InstanceState.DESTROYING, InstanceState.DESTROYED):
            return Instance.objects.get(pk=instance_id)
        return instance_transition(
            instance_id=instance_id,
            to_state=InstanceState.DESTROYING,
            reason=reason,
            work_due_at=timezone.now(),
            attempts=0,
        )


def instance_destroy(*, instance_id: int) -> WorkOutcome:
    """The work of a destroying instance: remove its container and data, then release every
    allocation. Retried (with backoff) until the host confirms."""

    def destroy(token: str) -> WorkOutcome:
        instance = Instance.objects.select_related("machine").get(pk=instance_id)
        try:
            _container_gone_or_stopped(DockerHost(instance.machine), instance, remove=True)
        except (HostUnreachable, HostKeyMismatch, CommandFailed) as error:
            return _waiting_for_host(instance, "Destroying", error)
        moved = instance_transition(
            instance_id=instance_id,
            to_state=InstanceState.DESTROYED,
            reason="Destroyed: the container and its data are removed",
            only_from={InstanceState.DESTROYING},
        )
        return WorkOutcome(instance_id, moved.state if moved else _state_of(instance_id))

    return _leased(instance_id, InstanceState.DESTROYING, destroy)


# States a stop may be asked for in.
STOPPABLE_STATES = {InstanceState.LAUNCHING, InstanceState.RUNNING, InstanceState.EXITED}

# How long a start may hold a stopped instance's GPUs before it counts as dead.
# instance_start commits the GPUs it takes back before it runs `docker start` over SSH (which
# times out long before this); a start whose worker died in between would otherwise hold them
# for good, so machine_reconcile gives them back once this has passed.
START_LEASE = timedelta(minutes=10)


def start_under_way() -> Exists:
    """Filter for stopped instances that instance_start has taken GPUs back for and not yet
    moved on.

    Every transition into the stopped state releases the GPUs, so live GPUs on a stopped
    instance are a start's (for START_LEASE). Its container may already run: it is the
    start's, not a leftover, and its GPUs must not be freed under it.
    """
    return Exists(
        live_gpu_allocations().filter(
            instance=OuterRef("pk"),
            instance__state=InstanceState.STOPPED,
            created_at__gt=timezone.now() - START_LEASE,
        )
    )


def instance_start(*, instance_id: int) -> Instance:
    """Take the GPUs back (409 if someone else has them) and start the container again.

    A stopped instance that has no container (stopped while it was launching) is launched
    again instead: it becomes launching, in the transaction that takes its GPUs back, and the
    caller queues the launch (a pull can take long; it never runs in a request).

    Otherwise the GPUs are committed before the container starts, so meanwhile the instance is
    still stopped but holds GPUs: machine_reconcile leaves it alone and instance_expire stops
    its container (``start_under_way``). It becomes running only if, when the container has
    started, it is still in the state it was started from and holds its GPUs; otherwise
    (expired, destroyed, or freed as a dead start meanwhile) its container is stopped again.
    """
    machine_id = Instance.objects.values_list("machine_id", flat=True).get(pk=instance_id)
    with transaction.atomic():
        # The machine before the instance, the order renting and reclaiming take them in.
        Machine.objects.select_for_update().get(pk=machine_id)
        instance = (
            Instance.objects.select_for_update(of=("self",))
            .select_related("machine")
            .get(pk=instance_id)
        )
        from_state = instance.state
        if from_state not in (InstanceState.STOPPED, InstanceState.EXITED):
            raise InvalidTransition(f"An instance that is {from_state} cannot be started.")
        if from_state == InstanceState.STOPPED:
            gpu_allocation_reclaim(instance=instance)
        if not instance.container_id:
            return instance_transition(
                instance_id=instance_id,
                to_state=InstanceState.LAUNCHING,
                reason="Launching again",
                work_due_at=timezone.now(),
                attempts=0,
                progress=0,
            )
    host = DockerHost(instance.machine)
    try:
        host.start(instance.container_id)
    except (CommandFailed, HostUnreachable):
        if from_state == InstanceState.STOPPED:
            with transaction.atomic():
                # Not if it moved on meanwhile: an expiry that could not confirm the container
                # stopped keeps the GPUs for machine_reconcile to release.
                locked = Instance.objects.select_for_update().get(pk=instance_id)
                if locked.state == from_state:
                    gpu_allocation_release(instance=instance)
        raise
    with transaction.atomic():
        current = Instance.objects.select_for_update().get(pk=instance_id)
        still_ours = current.state == from_state and (
            from_state != InstanceState.STOPPED
            or live_gpu_allocations().filter(instance=current).exists()
        )
        if still_ours:
            return instance_transition(
                instance_id=instance_id,
                to_state=InstanceState.RUNNING,
                reason="Started by the renter",
            )
    if current.state == InstanceState.RUNNING:
        return current  # exited, and reconcile saw the container running again first
    if current.state in (InstanceState.STOPPING, InstanceState.DESTROYING):
        return current  # a stop or destroy asked for meanwhile acts on the container itself
    # It moved on while the container started: it must not run on GPUs it no longer holds.
    _remove_quietly(host, instance.container_id, stop_only=current.state != InstanceState.DESTROYED)
    raise InvalidTransition(f"The instance became {current.state} while it was starting.")


# States whose container may be running and is stopped when the rental period ends.
LIVE_STATES = (
    InstanceState.LAUNCHING,
    InstanceState.RUNNING,
    InstanceState.EXITED,
    InstanceState.STOPPING,
)


def _container_stopped(host: DockerHost, instance: Instance) -> tuple[bool, str]:
    """Stop the instance's container; (True, "") once it is known not to run.

    (False, why) when that cannot be known: the host did not answer, or answered with a
    changed key. An instance without a recorded container is stopped by its deterministic
    name, which also catches a container a launch made without recording it.
    """
    starting = Instance.objects.filter(pk=instance.pk).filter(start_under_way()).exists()
    if instance.state not in LIVE_STATES and not starting:
        return True, ""  # stopped already, its GPUs given back then
    try:
        _container_gone_or_stopped(host, instance, remove=False)
    except CommandFailed as error:
        return False, f"docker stop failed: {error.stderr.strip()[:200]}"
    except (HostUnreachable, HostKeyMismatch) as error:
        return False, str(error)
    return True, ""


def _lease_valid(instance: Instance) -> bool:
    return instance.lease_expires_at is not None and instance.lease_expires_at > timezone.now()


def instance_expire(*, instance_id: int) -> Instance | None:
    """The contract's end: stop the container; data stays until the grace period ends.

    The rental ends on time whatever the host says (the renter is not charged past it). But
    its GPUs are given back only when the container is known to have stopped: with the host
    unreachable the container may still be running on them, so they stay reserved until
    ``machine_reconcile`` stops it and releases them.

    Returns None (and does nothing) for an instance that has ended already, or whose launch or
    stop a worker is carrying out right now: that finishes first, and the next expiry sweep
    ends what it left (so the container a launch is making is never left running).
    """
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    if instance.state in (
        InstanceState.EXPIRED,
        InstanceState.FAILED,
        InstanceState.DESTROYING,
        InstanceState.DESTROYED,
    ):
        return None
    if _lease_valid(instance):
        return None
    stopped, why = _container_stopped(DockerHost(instance.machine), instance)
    reason = "The rental period ended"
    if not stopped:
        logger.warning("could not stop expired instance %s: %s", instance_id, why)
        reason += (
            f"; the container could not be stopped yet ({why}), so its GPUs stay reserved "
            "until the host answers"
        )
    return instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.EXPIRED,
        reason=reason,
        keep_gpus=not stopped,
        only_from={instance.state},
    )


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
    containers = {c.name: c for c in host.list_platform_containers()}
    changed = 0
    watched = Instance.objects.filter(
        machine=machine, state__in=[InstanceState.RUNNING, InstanceState.EXITED]
    )
    for instance in watched:
        changed += _follow_container(instance, containers.get(instance.container_name))
    running_uuids = [c.instance for c in containers.values() if c.running and c.instance]
    holding = live_gpu_allocations().filter(instance=OuterRef("pk"))
    ended = (
        Instance.objects.filter(machine=machine)
        # Destroying is its own worker's to finish; the live states are followed above.
        .exclude(state__in=[*LIVE_STATES, InstanceState.DESTROYING])
        .filter(Q(uuid__in=running_uuids) | Exists(holding))
        # A start under way has its GPUs and (re)started container on purpose; stopping it and
        # freeing them would leave it running on GPUs someone else can rent.
        .exclude(start_under_way())
    )
    for instance in ended:
        changed += _end_leftover_container(host, instance, containers.get(instance.container_name))
    return changed


def _follow_container(instance: Instance, container) -> bool:
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
    return moved is not None


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
    if live_gpu_allocations().filter(instance=instance).exists():
        reason += "; its GPUs are free again"
    moved = instance_transition(
        instance_id=instance.pk,
        to_state=instance.state,
        reason=reason,
        only_from={instance.state},
    )
    return moved is not None


def machines_needing_reconcile() -> QuerySet[Machine]:
    """Online machines with containers to watch: live instances, or ended ones still holding
    GPUs because their container was not confirmed stopped."""
    live = Instance.objects.filter(state__in=[InstanceState.RUNNING, InstanceState.EXITED]).values(
        "machine_id"
    )
    unconfirmed = (
        live_gpu_allocations()
        .exclude(instance__state__in=GPU_HOLDING_STATES)
        .values("instance__machine_id")
    )
    return Machine.objects.filter(status="online").filter(Q(pk__in=live) | Q(pk__in=unconfirmed))
