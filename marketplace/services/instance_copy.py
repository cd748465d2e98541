"""Copying files into, out of and between a team's running instances (``vastai copy``).

Between the renter's own machine and an instance, the renter's ``rsync`` does the copying over
the instance's SSH (``rsync_endpoint`` opens the way and says where); between two instances,
the platform relays a tar stream from one container into the other (``instances_copy``), on
one machine or two. The caller has checked that the instances are its team's.
"""

from __future__ import annotations

import posixpath

from core.db import release_database_connection
from hosts.runtime.container_files import CopyFailed, container_copy, rsync_module_open
from marketplace.selectors import instance_ssh_address
from scheduler.models import Instance, InstanceState, LaunchMode


class CopyUnavailable(Exception):
    http_status = 409
    error_code = "invalid_state"


class CopyRefusedByInstance(Exception):
    """An instance refused the copy (its path, its image): nothing copied, or part of it."""

    http_status = 422
    error_code = "copy_failed"


def _running(instance: Instance) -> None:
    if instance.state != InstanceState.RUNNING or not instance.container_id:
        raise CopyUnavailable(f"Instance {instance.pk} is {instance.state}: files are copied only "
                              "while it runs.")  # fmt: skip


def rsync_endpoint(instance: Instance, *, into: str | None = None) -> tuple[str, int]:
    """Open the running SSH-mode instance to the CLI's rsync (module ``<id>`` or ``C.<id>``,
    user ``vastai_kaalia`` with the keys that log in as root) and return its SSH address.
    ``into``: where files will be written, whose parent directories are made first (rsync
    makes only the last)."""
    _running(instance)
    address = instance_ssh_address(instance)
    if instance.launch_mode != LaunchMode.SSH or address is None:
        raise CopyUnavailable(
            f"Instance {instance.pk} has no SSH: copy to and from your machine goes over an "
            "SSH-mode instance's sshd (rent with --ssh)."
        )
    machine, container = instance.machine, instance.container_id
    release_database_connection()
    try:
        parent = posixpath.dirname(into.rstrip("/")) if into else None
        rsync_module_open(machine, container, instance.pk, parent or None)
    except CopyFailed as error:
        raise CopyRefusedByInstance(str(error)) from None
    return address


def instances_copy(
    *, source: Instance, source_path: str, destination: Instance, destination_path: str
) -> int:
    """Copy a path of one running instance into a directory of another (rsync's reading of the
    source: a trailing slash copies the directory's contents). Returns the bytes relayed."""
    for instance in (source, destination):
        _running(instance)
    src = (source.machine, source.container_id, source_path)
    dst = (destination.machine, destination.container_id, destination_path)
    release_database_connection()
    try:
        return container_copy(src, dst)
    except CopyFailed as error:
        raise CopyRefusedByInstance(str(error)) from None
