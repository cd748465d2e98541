"""An instance's container on its host, found by id or else by its deterministic name.

Container commands never run inside a transaction: a slow host must not hold row locks, and a
rolled-back rental must not leave a container behind.
"""

from __future__ import annotations

import logging

from hosts.runtime import CommandFailed, DockerHost, HostUnreachable
from scheduler.models import Instance

logger = logging.getLogger(__name__)


def existing_container(host: DockerHost, name: str) -> str:
    """The id of the container with this name, or "" when there is none."""
    try:
        return str(host.inspect(name).get("Id", ""))
    except CommandFailed:
        return ""


def remove_quietly(host: DockerHost, container_id: str, *, stop_only: bool = False) -> None:
    try:
        if stop_only:
            host.stop(container_id)
        else:
            host.remove(container_id)
    except (CommandFailed, HostUnreachable):
        logger.warning("could not clean up container %s", container_id, exc_info=True)


def container_gone_or_stopped(host: DockerHost, instance: Instance, *, remove: bool) -> None:
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
        if existing_container(host, ref):
            raise
