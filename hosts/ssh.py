"""SSH to machines: one pooled connection per machine per process, host key pinned.

Every command is an argv list joined with ``shlex.join``, so each element reaches the remote
shell quoted. The pinned key is loaded before connecting and unknown or changed keys are
rejected (``RejectPolicy``; paramiko raises ``BadHostKeyException`` on a changed key), so no
command ever runs on a machine that is not the one the provider confirmed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import paramiko

from hosts.keys import platform_private_key

if TYPE_CHECKING:
    from hosts.models import Machine

CONNECT_TIMEOUT = 10.0
COMMAND_TIMEOUT = 120.0
KEEPALIVE_SECONDS = 30
MAX_SESSIONS_PER_HOST = 8


class HostError(Exception):
    http_status = 502
    error_code = "host_error"


class HostUnreachable(HostError):
    """Could not connect, or the connection dropped (transient: retry later)."""

    http_status = 503
    error_code = "host_unreachable"


class HostKeyMismatch(HostError):
    """The machine answered with a host key other than the pinned one. Nothing was run.

    ``presented`` is the key it offered instead (None when there is no pinned key at all).
    """

    http_status = 409
    error_code = "host_key_mismatch"

    def __init__(self, message: str, *, presented: RemoteHostKey | None = None):
        super().__init__(message)
        self.presented = presented


class CommandFailed(HostError):
    def __init__(self, argv: list[str], exit_code: int, stderr: str):
        self.argv, self.exit_code, self.stderr = argv, exit_code, stderr
        super().__init__(
            f"{argv[0]} {argv[1] if len(argv) > 1 else ''} exited {exit_code}: {stderr.strip()[:300]}"
        )


class CommandTimeout(HostUnreachable):
    error_code = "command_timeout"


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


def fingerprint(key_blob: bytes) -> str:
    """``SHA256:…`` exactly as ``ssh-keygen -lf`` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key_blob).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class RemoteHostKey:
    key_type: str
    key_base64: str
    fingerprint: str


def _remote_key(key: paramiko.PKey) -> RemoteHostKey:
    blob = key.asbytes()
    return RemoteHostKey(key.get_name(), base64.b64encode(blob).decode(), fingerprint(blob))


def fetch_host_key(address: str, port: int, timeout: float = CONNECT_TIMEOUT) -> RemoteHostKey:
    """Read the key a machine presents, without trusting it or logging in."""
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except OSError as error:
        raise HostUnreachable(f"Cannot reach {address}:{port}: {error}") from error
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        return _remote_key(transport.get_remote_server_key())
    except (paramiko.SSHException, OSError, EOFError) as error:
        raise HostUnreachable(f"{address}:{port} did not speak SSH: {error}") from error
    finally:
        transport.close()


def _known_host_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class Connection:
    """One authenticated SSH transport to a machine; sessions are opened per command."""

    def __init__(self, *, address: str, port: int, user: str, key_type: str, key_base64: str):
        self.address, self.port, self.user = address, port, user
        self.pinned = (key_type, key_base64)
        self.client = paramiko.SSHClient()
        self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        pinned_key = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_base64))
        self.client.get_host_keys().add(_known_host_name(address, port), key_type, pinned_key)
        try:
            self.client.connect(
                address, port, username=user, pkey=platform_private_key(),
                allow_agent=False, look_for_keys=False, timeout=CONNECT_TIMEOUT,
                banner_timeout=CONNECT_TIMEOUT, auth_timeout=CONNECT_TIMEOUT,
            )  # fmt: skip
        except paramiko.BadHostKeyException as error:
            presented = _remote_key(error.key)
            self.client.close()
            raise HostKeyMismatch(
                f"{address}:{port} presented {presented.fingerprint}, "
                f"not the pinned key; no command was run.",
                presented=presented,
            ) from error
        except paramiko.AuthenticationException as error:
            raise HostUnreachable(
                f"{user}@{address}:{port} refused the platform's key: is it in authorized_keys?"
            ) from error
        except (paramiko.SSHException, OSError, EOFError) as error:
            transport = self.client.get_transport()
            offered = transport.get_remote_server_key() if transport is not None else None
            self.client.close()
            if "not found in known_hosts" in str(error) and offered is not None:
                # The machine no longer offers a key of the pinned type at all: as changed
                # as a different key of the same type, and RejectPolicy refused it likewise.
                presented = _remote_key(offered)
                raise HostKeyMismatch(
                    f"{address}:{port} presented a {presented.key_type} key "
                    f"{presented.fingerprint}, not the pinned key; no command was run.",
                    presented=presented,
                ) from error
            raise HostUnreachable(f"Cannot connect to {address}:{port}: {error}") from error
        transport = self.client.get_transport()
        transport.set_keepalive(KEEPALIVE_SECONDS)
        # Commands are small request/response exchanges: without TCP_NODELAY, Nagle's
        # algorithm and delayed ACKs add ~40 ms to every one.
        transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        self.client.close()

    def _open(self, timeout: float) -> paramiko.Channel:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachable(f"The connection to {self.address}:{self.port} dropped.")
        try:
            channel = transport.open_session(timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as error:
            raise HostUnreachable(f"{self.address}:{self.port}: {error}") from error
        channel.settimeout(timeout)
        return channel

    def run(self, argv: list[str], *, timeout: float = COMMAND_TIMEOUT) -> CommandResult:
        channel = self._open(timeout)
        deadline = time.monotonic() + timeout
        stdout, stderr = bytearray(), bytearray()
        try:
            channel.exec_command(shlex.join(argv))
            # Block on stdout until EOF, draining stderr as it comes so neither stream's
            # window fills up and stalls the other; then whatever stderr is left.
            while chunk := channel.recv(65536):
                stdout += chunk
                while channel.recv_stderr_ready():
                    stderr += channel.recv_stderr(65536)
                if time.monotonic() > deadline:
                    raise CommandTimeout(f"{argv[0]} did not finish within {timeout:.0f}s")
            while chunk := channel.recv_stderr(65536):
                stderr += chunk
            code = channel.recv_exit_status()
        except TimeoutError as error:
            raise CommandTimeout(f"{argv[0]} did not finish within {timeout:.0f}s") from error
        except (paramiko.SSHException, OSError, EOFError) as error:
            raise HostUnreachable(f"{self.address}:{self.port}: {error}") from error
        finally:
            channel.close()
        return CommandResult(code, stdout.decode(errors="replace"), stderr.decode(errors="replace"))

    def stream(
        self, argv: list[str], *, timeout: float = COMMAND_TIMEOUT, stdin: bytes | None = None
    ) -> Iterator[str]:
        """Yield output lines (stdout and stderr) as they arrive, until the command exits.

        ``stdin`` is sent and closed first: the way to hand a secret to a command without it
        showing in the remote process list.
        """
        channel = self._open(timeout)
        channel.set_combine_stderr(True)
        try:
            channel.exec_command(shlex.join(argv))
            if stdin is not None:
                channel.sendall(stdin)
                channel.shutdown_write()
            pending = ""
            last_lines: deque[str] = deque(maxlen=5)  # for the error message if it fails
            while chunk := channel.recv(65536):
                pending += chunk.decode(errors="replace")
                *lines, pending = pending.replace("\r", "\n").split("\n")
                for line in lines:
                    if line:
                        last_lines.append(line)
                        yield line
            if pending:
                last_lines.append(pending)
                yield pending
            code = channel.recv_exit_status()
            if code != 0:
                raise CommandFailed(argv, code, "\n".join(last_lines))
        except (TimeoutError, paramiko.SSHException, OSError, EOFError) as error:
            raise HostUnreachable(f"{self.address}:{self.port}: {error}") from error
        finally:
            channel.close()


# Called as handler(machine_id, presented_key) when a machine presents another host key than
# the pinned one. hosts.apps registers the service that flags the machine, so whichever room
# ran the command (a launch, a heartbeat, a probe), the machine is marked at once.
key_mismatch_handlers: list[Callable[[int, RemoteHostKey], None]] = []


class Pool:
    """Connections kept per machine and reused across tasks in a worker process.

    A machine whose address, user or pinned key changed gets a new connection; a dead
    transport is replaced once before giving up. A semaphore bounds concurrent sessions per
    machine (sshd's MaxSessions defaults to 10). A changed host key raises HostKeyMismatch
    before authentication, so no command runs, and the handlers above flag the machine.
    """

    def __init__(self, connect: Callable[..., Connection] = Connection):
        self._connect = connect
        self._lock = threading.Lock()
        self._connections: dict[int, Connection] = {}
        self._sessions: dict[int, threading.BoundedSemaphore] = {}
        self._pid = None

    def _identity(self, machine: Machine) -> tuple:
        return (
            machine.address,
            machine.port,
            machine.ssh_user,
            machine.host_key_type,
            machine.host_key,
        )

    def connection(self, machine: Machine) -> Connection:
        if not machine.host_key:
            raise HostKeyMismatch("The machine has no confirmed host key yet; nothing was run.")
        with self._lock:
            if self._pid != os.getpid():  # never share a transport across a fork
                self._connections, self._sessions, self._pid = {}, {}, os.getpid()
            current = self._connections.get(machine.pk)
            if (
                current is not None
                and current.alive
                and (current.address, current.port, current.user, *current.pinned)
                == self._identity(machine)
            ):
                return current
            if current is not None:
                current.close()
                del self._connections[machine.pk]
            try:
                connection = self._connect(
                    address=machine.address, port=machine.port, user=machine.ssh_user,
                    key_type=machine.host_key_type, key_base64=machine.host_key,
                )  # fmt: skip
            except HostKeyMismatch as error:
                mismatch = error
            else:
                mismatch = None
                self._connections[machine.pk] = connection
                self._sessions.setdefault(
                    machine.pk, threading.BoundedSemaphore(MAX_SESSIONS_PER_HOST)
                )
                return connection
        # Outside the pool's lock: the handlers write to the database.
        if mismatch.presented is not None:
            for handler in key_mismatch_handlers:
                handler(machine.pk, mismatch.presented)
        raise mismatch

    def run(
        self, machine: Machine, argv: list[str], *, timeout: float = COMMAND_TIMEOUT
    ) -> CommandResult:
        for attempt in (1, 2):
            connection = self.connection(machine)
            with self._sessions[machine.pk]:
                try:
                    return connection.run(argv, timeout=timeout)
                except CommandTimeout:
                    raise
                except HostUnreachable:
                    if attempt == 2:
                        raise
                    self.forget(machine.pk)  # stale transport: reconnect once
        raise AssertionError("unreachable")

    def stream(
        self,
        machine: Machine,
        argv: list[str],
        *,
        timeout: float = COMMAND_TIMEOUT,
        stdin: bytes | None = None,
    ) -> Iterator[str]:
        connection = self.connection(machine)
        with self._sessions[machine.pk]:
            yield from connection.stream(argv, timeout=timeout, stdin=stdin)

    def forget(self, machine_id: int) -> None:
        with self._lock:
            connection = self._connections.pop(machine_id, None)
        if connection is not None:
            connection.close()

    def close_all(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()


pool = Pool()


def run(
    machine: Machine, argv: list[str], *, timeout: float = COMMAND_TIMEOUT, check: bool = True
) -> CommandResult:
    """Run argv on the machine over the pooled connection; raise CommandFailed on non-zero."""
    result = pool.run(machine, argv, timeout=timeout)
    if check and result.exit_code != 0:
        raise CommandFailed(argv, result.exit_code, result.stderr or result.stdout)
    return result
