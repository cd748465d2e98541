"""SSH to machines: one pooled connection per machine per process, host key pinned.

Every command is an argv list joined with ``shlex.join``, so each element reaches the remote
shell quoted. The pinned key is loaded before connecting and unknown or changed keys are
rejected (``RejectPolicy``; paramiko raises ``BadHostKeyException`` on a changed key), so no
command ever runs on a machine that is not the one the provider confirmed. A machine flagged
``key_mismatch`` gets no command at all until a person pins a key again, even over a
connection opened before the flag.

Errors shown to providers say only "no SSH server answered" whether the port was closed,
filtered or spoke something else, so adding machines cannot map the platform's network;
the details go to the log.

One module on purpose, just past the ~600-line habit: its errors, the pinned connection and
the pool are one concept (a command on a machine over SSH) that some 40 callers name as
``ssh.X``; the host-key and command errors are what each caller catches from the pool.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import paramiko

from hosts import addresses
from hosts.keys import fingerprint, team_private_key

if TYPE_CHECKING:
    from hosts.models import Machine

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
COMMAND_TIMEOUT = 120.0
KEEPALIVE_SECONDS = 30
# Session budgets per machine (sshd's MaxSessions defaults to 10). Streams (pulls, log
# follows) last minutes to hours, so they have their own budget and never starve the short
# commands (heartbeats, docker ps, launches).
MAX_COMMANDS_PER_HOST = 6
MAX_STREAMS_PER_HOST = 3
# How long a command waits for a free session before HostBusy (never longer than its own
# timeout).
SESSION_WAIT_SECONDS = 30.0
KEY_MISMATCH_STATUS = "key_mismatch"  # hosts.models.MachineStatus.KEY_MISMATCH


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


class HostBusy(HostUnreachable):
    """Every session of the machine stayed taken for the whole wait; nothing was run."""

    error_code = "host_busy"


class CommandNotStarted(HostUnreachable):
    """The session could not be opened, so the command surely did not run (safe to retry)."""


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


@dataclass(frozen=True)
class RemoteHostKey:
    key_type: str
    key_base64: str
    fingerprint: str


def _remote_key(key: paramiko.PKey) -> RemoteHostKey:
    blob = key.asbytes()
    return RemoteHostKey(key.get_name(), base64.b64encode(blob).decode(), fingerprint(blob))


def no_ssh_server(address: str, port: int, error: BaseException) -> HostUnreachable:
    """The one message a provider gets for a closed, filtered or non-SSH port (or a refused
    address): the same text whatever happened, so the platform is no port scanner. The
    reason is logged for operators."""
    logger.info("no SSH server at %s:%s: %s: %s", address, port, type(error).__name__, error)
    if isinstance(error, addresses.AddressRefused):
        return HostUnreachable(f"The platform does not connect to {address}: {error}.")
    return HostUnreachable(
        f"No SSH server answered at {address}:{port}. Check the address, the port and the firewall."
    )


def fetch_host_key(address: str, port: int, timeout: float = CONNECT_TIMEOUT) -> RemoteHostKey:
    """Read the key a machine presents, without trusting it or logging in."""
    try:
        sock = addresses.connect(address, port, timeout)
    except OSError as error:
        raise no_ssh_server(address, port, error) from error
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        return _remote_key(transport.get_remote_server_key())
    except (paramiko.SSHException, OSError, EOFError) as error:
        raise no_ssh_server(address, port, error) from error
    finally:
        transport.close()


def _known_host_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class Connection:
    """One authenticated SSH transport to a machine; sessions are opened per command."""

    def __init__(
        self,
        *,
        address: str,
        port: int,
        user: str,
        team_id: int,
        key_type: str,
        key_base64: str,
        connect_timeout: float = CONNECT_TIMEOUT,
    ):
        self.address, self.port, self.user, self.team_id = address, port, user, team_id
        self.pinned = (key_type, key_base64)
        self.client = paramiko.SSHClient()
        self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        pinned_key = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_base64))
        self.client.get_host_keys().add(_known_host_name(address, port), key_type, pinned_key)
        try:
            sock = addresses.connect(address, port, connect_timeout)
        except OSError as error:
            raise no_ssh_server(address, port, error) from error
        try:
            self.client.connect(
                address, port, username=user, pkey=team_private_key(team_id), sock=sock,
                allow_agent=False, look_for_keys=False, timeout=connect_timeout,
                banner_timeout=connect_timeout, auth_timeout=connect_timeout,
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
            # The transport (and its thread and socket) would otherwise linger until sshd's
            # login grace time ends.
            self.client.close()
            raise HostUnreachable(
                f"{user}@{address}:{port} refused the platform's key for team {team_id}: is "
                "that key (shown when adding a machine) in authorized_keys?"
            ) from error
        except (paramiko.SSHException, OSError, EOFError) as error:
            transport = self.client.get_transport()
            offered = None
            if transport is not None and transport.is_active():
                # Before the key exchange (a silent or non-SSH peer) there is no key to read.
                with contextlib.suppress(paramiko.SSHException):
                    offered = transport.get_remote_server_key()
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
            raise no_ssh_server(address, port, error) from error
        # addresses.connect set TCP_NODELAY on the socket.
        self.client.get_transport().set_keepalive(KEEPALIVE_SECONDS)

    @property
    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        self.client.close()

    def _dropped_midway(self, argv: list[str]) -> HostUnreachable | None:
        """After a channel ended without an exit status: was the connection lost, or was the
        command killed by a signal (paramiko drops sshd's exit-signal)? A dying sshd can close
        the channel a moment before the connection resets, so a transport that still looks
        alive is asked to prove it: it must open a new session within the connect timeout."""
        transport = self.client.get_transport()
        if transport is not None and transport.is_active() and transport.saved_exception is None:
            try:
                transport.open_session(timeout=CONNECT_TIMEOUT).close()
                return None
            except (paramiko.SSHException, OSError, EOFError):
                pass
        return HostUnreachable(
            f"The connection to {self.address}:{self.port} dropped while {argv[0]} ran; it may "
            "or may not have finished."
        )

    def _open(self, timeout: float) -> paramiko.Channel:
        """A session channel; CommandNotStarted if it cannot be opened (nothing ran)."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise CommandNotStarted(f"The connection to {self.address}:{self.port} dropped.")
        try:
            # A transport whose peer vanished looks alive until a request goes unanswered:
            # wait for the channel no longer than for a connect.
            channel = transport.open_session(timeout=min(timeout, CONNECT_TIMEOUT))
        except (paramiko.SSHException, OSError, EOFError) as error:
            raise CommandNotStarted(f"{self.address}:{self.port}: {error}") from error
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
            if code == -1 and (dropped := self._dropped_midway(argv)):
                raise dropped
        except TimeoutError as error:
            raise CommandTimeout(f"{argv[0]} did not finish within {timeout:.0f}s") from error
        except (paramiko.SSHException, OSError, EOFError) as error:
            raise HostUnreachable(
                f"The connection to {self.address}:{self.port} dropped while {argv[0]} ran; "
                f"it may or may not have finished ({error})."
            ) from error
        finally:
            channel.close()
        return CommandResult(code, stdout.decode(errors="replace"), stderr.decode(errors="replace"))

    def stream(
        self,
        argv: list[str],
        *,
        timeout: float = COMMAND_TIMEOUT,
        stdin: bytes | None = None,
        on_channel: Callable[[paramiko.Channel], None] | None = None,
    ) -> Iterator[str]:
        """Yield output lines (stdout and stderr) as they arrive, until the command exits.

        ``stdin`` is sent and closed first: the way to hand a secret to a command without it
        showing in the remote process list. ``on_channel`` is given the session's channel, so
        another thread can end a stream that is waiting for output by closing it.
        """
        channel = self._open(timeout)
        if on_channel is not None:
            on_channel(channel)
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
            if code == -1 and (dropped := self._dropped_midway(argv)):
                raise dropped
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


@dataclass
class _Slot:
    """One machine's place in the pool: its connection, the lock held while (re)connecting
    to it, and its session budgets."""

    connecting: threading.Lock
    commands: threading.BoundedSemaphore
    streams: threading.BoundedSemaphore
    connection: Connection | None = field(default=None)


class Pool:
    """Connections kept per machine and reused across tasks in a worker process.

    A machine whose address, user or pinned key changed gets a new connection. Connecting
    holds only that machine's lock, so a slow or dead machine never delays the others.
    Sessions are bounded per machine, one budget for commands and one for streams, and a
    caller waits for a session at most ``wait_seconds`` (HostBusy after that). A command is
    retried on a fresh connection only when it surely never started (its session could not
    be opened on a stale connection); after a drop mid-command it is retried only when the
    caller says it is idempotent, so a ``docker run`` never runs twice. A changed host key
    raises HostKeyMismatch before authentication and the handlers above flag the machine;
    a flagged machine gets nothing until a person pins a key again.
    """

    def __init__(
        self,
        connect: Callable[..., Connection] = Connection,
        *,
        max_commands: int = MAX_COMMANDS_PER_HOST,
        max_streams: int = MAX_STREAMS_PER_HOST,
        wait_seconds: float = SESSION_WAIT_SECONDS,
        connect_timeout: float = CONNECT_TIMEOUT,
    ):
        self._connect = connect
        self._max_commands, self._max_streams = max_commands, max_streams
        self._wait_seconds, self._connect_timeout = wait_seconds, connect_timeout
        self._lock = threading.Lock()  # guards _slots only; never held during I/O
        self._slots: dict[int, _Slot] = {}
        self._pid: int | None = None

    def _slot(self, machine_id: int) -> _Slot:
        with self._lock:
            if self._pid != os.getpid():  # never share a transport across a fork
                self._slots, self._pid = {}, os.getpid()
            slot = self._slots.get(machine_id)
            if slot is None:
                slot = self._slots[machine_id] = _Slot(
                    connecting=threading.Lock(),
                    commands=threading.BoundedSemaphore(self._max_commands),
                    streams=threading.BoundedSemaphore(self._max_streams),
                )
            return slot

    @staticmethod
    def _identity(machine: Machine) -> tuple:
        return (
            machine.address,
            machine.port,
            machine.ssh_user,
            machine.team_id,
            machine.host_key_type,
            machine.host_key,
        )

    def connection(self, machine: Machine) -> Connection:
        if not machine.host_key:
            raise HostKeyMismatch("The machine has no confirmed host key yet; nothing was run.")
        if getattr(machine, "status", None) == KEY_MISMATCH_STATUS:
            self.forget(machine.pk)
            raise HostKeyMismatch(
                f"{machine.address}:{machine.port} is flagged for a changed host key; nothing "
                "runs on it until a person pins a key again."
            )
        slot = self._slot(machine.pk)
        # Others wanting this machine wait for one connect (each step bounded by the connect
        # timeout); others wanting other machines do not wait at all.
        if not slot.connecting.acquire(timeout=3 * self._connect_timeout + 5):
            raise HostBusy(f"Still connecting to {machine.address}:{machine.port}; try again.")
        try:
            current = slot.connection
            if (
                current is not None
                and current.alive
                and (current.address, current.port, current.user, current.team_id) + current.pinned
                == self._identity(machine)
            ):
                return current
            if current is not None:
                slot.connection = None
                current.close()
            try:
                connection = self._connect(
                    address=machine.address, port=machine.port, user=machine.ssh_user,
                    team_id=machine.team_id, key_type=machine.host_key_type,
                    key_base64=machine.host_key, connect_timeout=self._connect_timeout,
                )  # fmt: skip
            except HostKeyMismatch as error:
                mismatch = error
            else:
                slot.connection = connection
                return connection
        finally:
            slot.connecting.release()
        # Outside the lock: the handlers write to the database.
        if mismatch.presented is not None:
            for handler in key_mismatch_handlers:
                handler(machine.pk, mismatch.presented)
        raise mismatch

    def _session(self, budget: threading.BoundedSemaphore, machine: Machine, timeout: float):
        wait = min(self._wait_seconds, timeout)
        if not budget.acquire(timeout=wait):
            raise HostBusy(
                f"{machine.address}:{machine.port} has no free SSH session after {wait:.0f}s "
                "of waiting; nothing was run."
            )
        return budget

    def run(
        self,
        machine: Machine,
        argv: list[str],
        *,
        timeout: float = COMMAND_TIMEOUT,
        idempotent: bool = False,
    ) -> CommandResult:
        """Run argv on one session. ``idempotent=True`` lets a command whose connection dropped
        mid-way run again on a fresh one (reads, ``true``); otherwise the caller gets
        HostUnreachable and decides (a launch checks what exists before trying again)."""
        slot = self._slot(machine.pk)
        for attempt in (1, 2):
            connection = self.connection(machine)
            budget = self._session(slot.commands, machine, timeout)
            started = time.perf_counter()
            try:
                result = connection.run(argv, timeout=timeout)
                _command_logged(machine, argv, result.exit_code, started, idempotent=idempotent)
                return result
            except CommandTimeout:
                raise
            except CommandNotStarted:
                if attempt == 2:
                    raise
            except HostUnreachable:
                if attempt == 2 or not idempotent:
                    raise
            finally:
                budget.release()
            self._drop(machine.pk, connection)  # stale transport: reconnect once
        raise AssertionError("unreachable")

    def stream(
        self,
        machine: Machine,
        argv: list[str],
        *,
        timeout: float = COMMAND_TIMEOUT,
        stdin: bytes | None = None,
        on_channel: Callable[[paramiko.Channel], None] | None = None,
    ) -> Iterator[str]:
        """Yield output lines on a session from the streams' budget (never a command's)."""
        slot = self._slot(machine.pk)
        for attempt in (1, 2):
            connection = self.connection(machine)
            budget = self._session(slot.streams, machine, timeout)
            try:
                # CommandNotStarted comes before the first line, so nothing is repeated.
                yield from connection.stream(
                    argv, timeout=timeout, stdin=stdin, on_channel=on_channel
                )
                return
            except CommandNotStarted:
                if attempt == 2:
                    raise
            finally:
                budget.release()
            self._drop(machine.pk, connection)

    @contextlib.contextmanager
    def channel(
        self, machine: Machine, argv: list[str], *, timeout: float = COMMAND_TIMEOUT
    ) -> Iterator[paramiko.Channel]:
        """A session running argv whose stdin, stdout and stderr the caller drives (to pipe
        one command's output into another's input), on the streams' budget. Never retried:
        the caller sees any drop."""
        slot = self._slot(machine.pk)
        connection = self.connection(machine)
        budget = self._session(slot.streams, machine, timeout)
        try:
            channel = connection._open(timeout)
            try:
                channel.exec_command(shlex.join(argv))
                yield channel
            finally:
                channel.close()
        finally:
            budget.release()

    def _drop(self, machine_id: int, connection: Connection) -> None:
        """Forget ``connection`` if it is still the machine's (another thread may already
        have replaced it with a working one)."""
        slot = self._slot(machine_id)
        with self._lock:
            stale = slot.connection is connection
            if stale:
                slot.connection = None
        if stale:
            connection.close()

    def forget(self, machine_id: int) -> None:
        with self._lock:
            slot = self._slots.get(machine_id) if self._pid == os.getpid() else None
            connection = slot.connection if slot is not None else None
            if slot is not None:
                slot.connection = None
        if connection is not None:
            connection.close()

    def close_all(self) -> None:
        with self._lock:
            slots = list(self._slots.values()) if self._pid == os.getpid() else []
            connections = [slot.connection for slot in slots if slot.connection is not None]
            for slot in slots:
                slot.connection = None
        for connection in connections:
            connection.close()


pool = Pool()


def _command_logged(
    machine: Machine, argv: list[str], exit_code: int, started: float, *, idempotent: bool
) -> None:
    """One line per command, naming only its program and subcommand: the rest of an argv may
    hold a renter's env values or a registry login. Reads that heartbeats and probes repeat
    all day (idempotent ones) are DEBUG; the rest INFO. The context bound by the task (request,
    task, team and instance ids) goes with it."""
    logger.log(
        logging.DEBUG if idempotent else logging.INFO,
        "ssh command %s on machine %s: exit %s",
        " ".join(argv[:2]),
        machine.pk,
        exit_code,
        extra={
            "machine_id": machine.pk,
            "command": " ".join(argv[:2]),
            "exit_code": exit_code,
            "duration_ms": round((time.perf_counter() - started) * 1000, 1),
        },
    )


def run(
    machine: Machine,
    argv: list[str],
    *,
    timeout: float = COMMAND_TIMEOUT,
    check: bool = True,
    idempotent: bool = False,
) -> CommandResult:
    """Run argv on the machine over the pooled connection; raise CommandFailed on non-zero.

    ``idempotent=True`` for commands that may safely run twice (see ``Pool.run``)."""
    result = pool.run(machine, argv, timeout=timeout, idempotent=idempotent)
    if check and result.exit_code != 0:
        raise CommandFailed(argv, result.exit_code, result.stderr or result.stdout)
    return result
