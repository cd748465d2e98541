"""Launching: start an instance's container on its machine, pulling its image when needed."""

from __future__ import annotations

import logging
from collections.abc import Callable

from hosts.runtime import (
    EXIT_DOCKER_ERROR,
    CommandFailed,
    ContainerSpec,
    DockerHost,
    HostKeyMismatch,
    HostUnreachable,
    ImageNotOnHost,
    RegistryLoginRefused,
    check_registry,
    image_repository,
)
from scheduler.models import (
    GPU_HOLDING_STATES,
    Instance,
    InstanceState,
    LaunchMode,
)
from scheduler.services.allocations import instance_holds_gpus
from scheduler.services.container_spec import check_launch_mode, container_spec_for
from scheduler.services.containers import container_removed, existing_container
from scheduler.services.errors import LaunchInterrupted
from scheduler.services.interruption import gpus_vacate
from scheduler.services.leased_work import WorkOutcome, leased, waiting_for_host
from scheduler.services.mode_service import mode_service_wait
from scheduler.services.private_images import pull_with_login, repository_private
from scheduler.services.transitions import instance_report_progress, instance_transition, state_of
from scheduler.services.versions import instance_version_fall_back

logger = logging.getLogger(__name__)

# A launch whose host does not answer is tried this many times (about half an hour with the
# backoff in scheduler.work) before it fails and the rental ends.
MAX_LAUNCH_ATTEMPTS = 10


def instance_launch(
    *,
    instance_id: int,
    ssh_keys: Callable[[], list[str]] | None = None,
    registry_credentials: tuple[str, str] | None = None,
    team_env: Callable[[], dict[str, str]] | None = None,
) -> WorkOutcome:
    """Start the instance's container on its machine; idempotent. ``ssh_keys`` gives the
    team's public keys, asked for only by an SSH launch (the one that puts them in);
    ``team_env`` the team's variables, which the new container gets in its environment.

    Only the worker holding the lease touches the host; another gets "busy". The container
    name is derived from the instance, so a later attempt (a worker killed mid-way, its lease
    expired) finds the container the first one made and adopts it instead of starting another.
    """
    return leased(
        instance_id,
        InstanceState.LAUNCHING,
        lambda token: _launch_leased(instance_id, token, ssh_keys, registry_credentials, team_env),
    )


def instance_launch_fail(*, instance_id: int, reason: str) -> WorkOutcome:
    """End a launch that cannot go on, for a reason found before any host was asked (its
    GPUs are freed and its rental settles, as for any failed launch)."""
    return _launch_failed(instance_id, reason, container_stopped=True)


def _launch_failed(
    instance_id: int, reason: str, *, container_stopped: bool, host: DockerHost | None = None
) -> WorkOutcome:
    """The launch cannot go on. A new version whose host answered (``host``) gives way to
    the version before it, which runs again; any other launch fails and its rental ends.

    Its GPUs are given back only when no container of it can run (``container_stopped``):
    a host that stopped answering mid-launch may have started it, and reconcile releases
    them once Docker lists it stopped."""
    logger.warning("launch of instance %s failed: %s", instance_id, reason)
    if host is not None:
        instance = Instance.objects.get(pk=instance_id)
        if instance.state == InstanceState.LAUNCHING and instance.version > 1:
            back = instance_version_fall_back(host, instance, reason)
            if back is not None:
                return WorkOutcome(instance_id, back.state, back.container_id)
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.FAILED,
        reason=reason,
        only_from={InstanceState.LAUNCHING},
        container_stopped=container_stopped,
    )
    return WorkOutcome(instance_id, moved.state if moved else state_of(instance_id))


def _launch_leased(
    instance_id: int,
    token: str,
    ssh_keys: Callable[[], list[str]] | None,
    registry_credentials: tuple[str, str] | None,
    team_env: Callable[[], dict[str, str]] | None = None,
) -> WorkOutcome:
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    if instance.state != InstanceState.LAUNCHING:
        return WorkOutcome(instance_id, instance.state)
    # Attempts are counted when the lease is taken, so only a later attempt can find a
    # container an earlier one made; the first skips that look-up.
    first_attempt = instance.attempts == 1
    host = DockerHost(instance.machine)
    try:
        gpus_vacate(host, instance)  # GPUs taken from an interrupted rental: its container stops
        keys = ssh_keys() if ssh_keys and instance.launch_mode == LaunchMode.SSH else None
        spec = container_spec_for(
            instance, ssh_keys=keys, team_env=team_env() if team_env else None
        )
        existing = "" if first_attempt else existing_container(host, instance.container_name)
        if existing:
            host.start(existing)  # a no-op when it is already running
            container_id = existing
        else:
            container_id = _run_pulling_if_needed(host, instance, spec, registry_credentials)
        check_launch_mode(host, instance, container_id)
        started = mode_service_wait(host, instance, container_id)
    except LaunchInterrupted:
        # Stopped or destroyed meanwhile: that work, waiting for this lease, stops or removes
        # the container by its name.
        return WorkOutcome(instance_id, state_of(instance_id))
    except HostUnreachable as error:
        if instance.attempts >= MAX_LAUNCH_ATTEMPTS:
            return _launch_failed(
                instance_id,
                f"Launch failed: the host did not answer in {instance.attempts} tries ({error})",
                container_stopped=False,
            )
        return waiting_for_host(instance, "Launching", error)
    except HostKeyMismatch as error:
        return _launch_failed(instance_id, f"Launch refused: {error}", container_stopped=False)
    except (CommandFailed, ValueError) as error:
        # `docker run` can fail after creating the container (a port taken, say): remove it,
        # so nothing is left behind the failed rental.
        removed = container_removed(host, instance.container_name)
        return _launch_failed(
            instance_id, f"Launch failed: {error}", container_stopped=removed, host=host
        )
    moved = instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.RUNNING,
        reason=started if not existing else "Container found running",
        only_from={InstanceState.LAUNCHING},
        launched_as_asked=True,
        container_id=container_id,
        progress=100,
    )
    if moved is None:
        # It left launching while `docker run` ran. Stopping and destroying wait for this lease
        # and then act on the container by name; tell them its id too. Any other state holds
        # no GPUs, so the container must not run.
        Instance.objects.filter(pk=instance_id, container_id="").update(container_id=container_id)
        current = state_of(instance_id)
        # Not holding GPUs any more (ended, or interrupted: another rental has them now), the
        # container must not run.
        if current not in GPU_HOLDING_STATES or not instance_holds_gpus(
            Instance.objects.get(pk=instance_id)
        ):
            container_removed(host, container_id, stop_only=current != InstanceState.DESTROYED)
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
    when this rental must prove access first: given with a login, or of a repository the
    registry proved private here (scheduler.services.private_images). Then it is pulled with
    this rental's own login (or none), so a private image another team left on the machine
    runs only for those the registry admits.

    A container of this name appearing meanwhile (a launcher whose claim had expired, still
    at work) is adopted, never removed: it may be the one that is running.
    """
    private = credentials is None and repository_private(
        machine_id=instance.machine_id, repository=image_repository(spec.image)
    )
    if credentials is None and not private:
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
    pulling = lambda pct, msg: report(5 + int(pct * 0.85), msg)  # noqa: E731
    try:
        if credentials is not None:
            pull_with_login(host, instance, credentials, pulling)
        else:
            host.pull(instance.image, progress_callback=pulling)
    except RegistryLoginRefused:
        raise
    except CommandFailed as error:
        # Private here: the local copy is not this rental's until the registry admits it.
        hint = " without a login (it is private: give registry_username and registry_password)"
        raise CommandFailed(
            error.argv,
            error.exit_code,
            f"could not pull {instance.image}{hint if private else ''}: {error.stderr}",
        ) from error
    report(92, "Starting container")
    try:
        return host.run(spec, pull=False)
    except CommandFailed as error:
        if _may_exist(error):
            return _adopt(host, instance, error)
        raise


def _adopt(host: DockerHost, instance: Instance, error: CommandFailed) -> str:
    existing = existing_container(host, instance.container_name)
    if not existing:
        raise error
    host.start(existing)
    return existing
