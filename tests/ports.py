"""Ports for what tests start or connect to, handed out by the OS and never guessed.

- A server that can be told port 0 (uvicorn, Caddy's sites) binds a port the OS picks and
  says which in its log: ``port_in_log`` reads it there.
- One that cannot (Caddy's admin endpoint, whose Host check must name its port;
  redis-server, whose ``--port 0`` means "no TCP"): ``serve_on_a_free_port`` gives it a port
  the OS just handed out, checks that this very process listens on it, and starts it again on
  another if someone took the port in between. ``bind_a_free_port`` does the same for a
  running server told to listen later (Caddy loading a config through its admin API).
- A port nothing listens on, for a test of what a refused connection looks like:
  ``closed_port`` holds it bound without listening, so a connection is refused and nobody else
  can bind it while the test runs.

A port bound and closed before use (the old ``_free_port``) could be taken by another process
before the server bound it, and a fixed port collides with whatever else runs on the machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def port_in_log(log: Path, pattern: str, process: subprocess.Popen, timeout: float = 60) -> int:
    """The port a server started on port 0 reports in its log (``pattern``'s first group)."""
    deadline = time.monotonic() + timeout
    while True:
        found = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if found:
            return int(found.group(1))
        if process.poll() is not None:
            raise RuntimeError(f"exited ({process.returncode}) before it listened: see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"did not say which port it listens on in {timeout:.0f} s: {log}")
        time.sleep(0.05)


def serve_on_a_free_port(
    start: Callable[[int], subprocess.Popen], timeout: float = 30, attempts: int = 5
) -> tuple[subprocess.Popen, int]:
    """Start a server with ``start(port)`` on a port the OS handed out; the running process
    and its port once it listens there itself."""
    for _ in range(attempts):
        port = _os_port()
        process = start(port)
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            if listens(process.pid, port):
                return process, port
            time.sleep(0.05)
        if process.poll() is None:  # never listened there in time: not a port taken meanwhile
            process.kill()
            process.wait(timeout=10)
            raise RuntimeError(f"{process.args[0]} did not listen on {port} in {timeout:.0f} s")
    raise RuntimeError(f"{attempts} ports in a row were taken before the server bound them")


def bind_a_free_port(pid: int, bind: Callable[[int], None], attempts: int = 5) -> int:
    """``bind(port)`` asks running process ``pid`` to listen on ``port`` (and raises if it
    could not); the port once the process listens there."""
    refused: Exception | None = None
    for _ in range(attempts):
        port = _os_port()
        try:
            bind(port)
        except Exception as error:  # taken meanwhile, most likely: try another
            refused = error
            continue
        if listens(pid, port):
            return port
    raise RuntimeError(f"no port of {attempts} in a row could be bound; the last: {refused}")


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A local port that refuses connections for as long as the block runs."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        yield held.getsockname()[1]


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` has a TCP socket listening on ``port`` (Linux's /proc)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{inode}]")
    if not inodes:
        return False
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return True
    return False


def _os_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
