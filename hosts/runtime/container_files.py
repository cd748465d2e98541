"""Files into and between running containers, over the pooled SSH connections.

``container_copy`` relays a tar stream from ``docker exec <source> tar -c`` on one machine
into ``docker exec -i <destination> tar -x`` on another (or the same): the bytes pass through
the platform and nothing is written on either host. ``rsync_module_open`` lets the renter's
own ``rsync`` reach a container as vast.ai's CLI runs it: an rsync daemon over the instance's
SSH, as user ``vastai_kaalia``, module ``<id>`` (or ``C.<id>``).

Paths and ids are positional arguments of fixed scripts or argv elements (``shlex.join``
quotes each), never pasted into a command line, and a name handed to ``tar`` always starts
with ``./`` or ``/``, so no path can be read as an option.
"""

from __future__ import annotations

import posixpath
import time
from typing import TYPE_CHECKING

import paramiko

from hosts import ssh
from hosts.runtime.docker_host import _container_ref

if TYPE_CHECKING:
    from hosts.models import Machine

COPY_TIMEOUT = 600.0
CHUNK = 1 << 16
MISSING_PROGRAM = 78  # as the launch modes' bootstrap exits for a missing sshd

# In the destination: $1 the directory the files go into (made first).
_UNPACK = 'mkdir -p "$1" && exec tar -x -f - -C "$1"'

# vast.ai's CLI runs `rsync … -e "ssh -p <port>" vastai_kaalia@<address>::<id>/<path>`: an rsync
# daemon over SSH. As uid 0 (a second name for root, with root's home and so root's
# authorized_keys: the keys that may log in already) it reads /etc/rsyncd.conf, where the
# instance's modules are the whole container, as root (the renter's own container).
# $1 the instance's id, $2 a directory to make first (rsync makes only a target's last part).
RSYNC_USER = "vastai_kaalia"
_RSYNC_MODULE = f"""set -e
command -v rsync >/dev/null || {{ echo "the image has no rsync" >&2; exit {MISSING_PROGRAM}; }}
grep -q '^{RSYNC_USER}:' /etc/passwd || echo '{RSYNC_USER}:x:0:0:vastai copy:/root:/bin/sh' >> /etc/passwd
printf '%s\\n' 'uid = 0' 'gid = 0' 'use chroot = no' 'numeric ids = yes' \\
  "[$1]" 'path = /' 'read only = no' "[C.$1]" 'path = /' 'read only = no' > /etc/rsyncd.conf
[ -z "$2" ] || mkdir -p "$2"
"""


class CopyFailed(Exception):
    """A copy a container refused (no such path, no rsync, no room): nothing was copied, or
    only part (what ``tar`` wrote before it stopped)."""


def _pack_argv(container: str, path: str) -> list[str]:
    """rsync's reading of a source path: with a trailing slash, the directory's contents;
    without, the file or directory itself."""
    if path.endswith("/"):
        directory, name = path, "."
    else:
        directory, base = posixpath.split(path)
        name = f"./{base}"
    return ["docker", "exec", _container_ref(container), "tar", "-c", "-f", "-", "-C",
            directory or "/", name]  # fmt: skip


def _drain(channel: paramiko.Channel) -> tuple[int, str]:
    """The command's exit status and the end of its stderr, once it has finished."""
    err = bytearray()
    while chunk := channel.recv_stderr(CHUNK):
        err += chunk
    return channel.recv_exit_status(), err.decode(errors="replace")[-300:].strip()


def _relay(
    tar_out: paramiko.Channel, sink: paramiko.Channel, deadline: float, timeout: float
) -> tuple[int, bool]:
    """Send the source's output into the destination until it ends; returns the bytes sent
    and whether the destination stopped reading first."""
    copied = 0
    while chunk := tar_out.recv(CHUNK):
        try:
            sink.sendall(chunk)
        except OSError:
            if sink.exit_status_ready():
                return copied, True
            raise
        copied += len(chunk)
        if time.monotonic() > deadline:
            raise ssh.CommandTimeout(f"the copy did not finish within {timeout:.0f}s")
    return copied, False


def container_copy(
    source: tuple[Machine, str, str],
    destination: tuple[Machine, str, str],
    *,
    timeout: float = COPY_TIMEOUT,
) -> int:
    """Copy ``(machine, container, path)`` to ``(machine, container, directory)``; returns the
    bytes relayed. CopyFailed when the source path is missing or either side's tar fails."""
    (src_machine, src_container, src_path), (dst_machine, dst_container, dst_dir) = (
        source,
        destination,
    )
    if not (src_path.startswith("/") and dst_dir.startswith("/")):
        raise CopyFailed("Paths in an instance are absolute (they start with /).")
    found = ssh.run(
        src_machine,
        ["docker", "exec", _container_ref(src_container), "test", "-e", src_path],
        timeout=30,
        check=False,
    )
    if found.exit_code != 0:
        raise CopyFailed(f"{src_path} does not exist in the source instance.")
    pack = _pack_argv(src_container, src_path)
    unpack = ["docker", "exec", "-i", _container_ref(dst_container), "sh", "-c", _UNPACK, "sh",
              dst_dir]  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        with ssh.pool.channel(dst_machine, unpack, timeout=timeout) as sink:
            with ssh.pool.channel(src_machine, pack, timeout=timeout) as tar_out:
                copied, sink_stopped = _relay(tar_out, sink, deadline, timeout)
                # A destination that stopped reading leaves the source blocked on its output:
                # its channel is closed unread (which ends it), and the destination says why.
                packed, pack_error = (0, "") if sink_stopped else _drain(tar_out)
            if not sink_stopped:
                sink.shutdown_write()
            while sink.recv(CHUNK):
                pass
            unpacked, unpack_error = _drain(sink)
    except TimeoutError as error:
        raise ssh.CommandTimeout(f"the copy did not finish within {timeout:.0f}s") from error
    except (paramiko.SSHException, OSError, EOFError) as error:
        raise ssh.HostUnreachable(f"the connection dropped during the copy ({error})") from error
    if packed != 0:
        raise CopyFailed(f"Reading {src_path} failed: {pack_error or f'exit {packed}'}")
    if unpacked != 0:
        raise CopyFailed(f"Writing into {dst_dir} failed: {unpack_error or f'exit {unpacked}'}")
    return copied


def rsync_module_open(
    machine: Machine, container: str, instance_id: int, parent: str | None = None
) -> None:
    """Make the container's rsync modules ``<id>`` and ``C.<id>`` for the CLI's rsync (see
    ``_RSYNC_MODULE``), and the absolute directory ``parent`` where files will go in;
    CopyFailed when its image has no rsync."""
    if parent is not None and not parent.startswith("/"):
        raise CopyFailed("Paths in an instance are absolute (they start with /).")
    result = ssh.run(
        machine,
        ["docker", "exec", _container_ref(container), "sh", "-c", _RSYNC_MODULE, "sh",
         str(int(instance_id)), parent or ""],
        timeout=30,
        check=False,
    )  # fmt: skip
    if result.exit_code == MISSING_PROGRAM:
        raise CopyFailed("The instance's image has no rsync: install it (apt-get install rsync).")
    if result.exit_code != 0:
        raise CopyFailed(f"The instance refused: {(result.stderr or result.stdout)[-300:]}")
