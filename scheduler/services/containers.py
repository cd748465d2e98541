"""An instance's container on its host, found by id or else by its deterministic name.

Container commands never run inside a transaction: a slow host must not hold row locks, and a
rolled-back rental must not leave a container behind.

What a host says happened is what Docker answered: a command that failed proves nothing about
the container (the daemon may be down), so "gone" and "stopped" are written only after Docker
itself lists the container as absent or stopped.
"""

from __future__ import annotations

import logging

from hosts.runtime import CommandFailed, DockerHost, HostKeyMismatch, HostUnreachable
from scheduler.models import Instance

logger = logging.getLogger(__name__)


def existing_container(host: DockerHost, ref: str) -> str:
    """The id of the container ``ref`` (an id or a name), or "" when Docker answers that there
    is none. Raises CommandFailed or HostUnreachable when Docker does not answer."""
    return host.container_id(ref)


def container_removed(host: DockerHost, ref: str, *, stop_only: bool = False) -> bool:
    """Remove (or stop) the container ``ref``; True only when Docker confirms it is gone (or
    stopped). False, with a warning, when the host or its Docker did not answer: the caller
    must not give the container's GPUs to anyone, and reconcile finishes the job later."""
    try:
        container_gone_or_stopped(host, ref, remove=not stop_only)
    except (CommandFailed, HostUnreachable, HostKeyMismatch):
        logger.warning("could not clean up container %s", ref, exc_info=True)
        return False
    return True


def container_gone_or_stopped(host: DockerHost, ref: str, *, remove: bool) -> None:
    """Stop (or remove) the container ``ref``. One that Docker lists as absent counts as
    stopped; a failed ``docker stop``/``docker rm`` is looked into, never taken as done.
    Raises HostUnreachable, HostKeyMismatch or CommandFailed when it cannot be known."""
    try:
        if remove:
            host.remove(ref)
        else:
            host.stop(ref)
    except CommandFailed:
        if existing_container(host, ref):
            raise


def instance_container_ref(instance: Instance) -> str:
    """The instance's container: its recorded id, or else its deterministic name (a launch
    may have made it without recording the id)."""
    return instance.container_id or instance.container_name
