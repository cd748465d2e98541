"""Following a container's log: ``docker logs --follow`` over the machine's pooled SSH, in a
thread, handing lines to a WebSocket's event loop.

The stream takes one of the machine's stream sessions (hosts.ssh keeps a small budget of them,
apart from commands), so a follower must let go of it: when the socket closes it stops at the
next line, and a container that prints nothing ends the stream after ``IDLE_SECONDS`` (the
SSH channel's read timeout), after which the follower asks again from that point on (``--tail
0``). A line printed in the moment between the two streams can be missed; the tail view
(``docker logs --tail``) always has it.

Stopping a follower closes its SSH channel, so the read it is blocked in returns and the
session is given back at once, not at the next line or the idle timeout. One process runs at
most ``MAX_FOLLOWERS_PER_MACHINE`` followers per machine, stopping ones included: fewer than the
machine's stream sessions, so a pull in the same process still gets one, and a follow past the
cap is refused at once (``TooManyFollowers``) instead of waiting for a session.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from hosts.models import Machine
from hosts.runtime import CommandFailed, DockerHost, HostKeyMismatch, HostUnreachable
from hosts.ssh import MAX_STREAMS_PER_HOST, HostBusy

logger = logging.getLogger(__name__)

IDLE_SECONDS = 20.0
MAX_PENDING_LINES = 5000  # a slow browser loses the oldest lines beyond this, and is told
MAX_FOLLOWERS_PER_MACHINE = MAX_STREAMS_PER_HOST - 1  # per process; leaves a session for pulls

_following_lock = threading.Lock()
_following: dict[int, set[LogFollower]] = {}  # machine id -> its followers' threads alive here


class TooManyFollowers(Exception):
    """This process already follows ``MAX_FOLLOWERS_PER_MACHINE`` logs on the machine."""


def followers_on(machine_id: int) -> int:
    """How many followers (stopping ones included) this process has on the machine."""
    with _following_lock:
        return len(_following.get(machine_id, ()))


class LogFollower(threading.Thread):
    """Streams one container's log lines into a bounded buffer until stopped or the end.

    ``wake`` is called (from this thread) whenever lines or the end are ready; the owner
    then calls ``take()``. The end reason is set once, when the stream stops for good.
    """

    def __init__(
        self, *, machine: Machine, container: str, tail: int, wake: Callable[[], None]
    ) -> None:
        super().__init__(name=f"logs-{container[:12]}", daemon=True)
        self.machine, self.container, self.tail, self.wake = machine, container, tail, wake
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._lines: deque[str] = deque(maxlen=MAX_PENDING_LINES)
        self._dropped = 0
        self._channel = None  # the open stream's SSH channel, closed to stop at once
        self.end_reason: str | None = None

    def start(self) -> None:
        """Start the thread, or raise TooManyFollowers (and start nothing) at the machine's cap."""
        with _following_lock:
            mine = _following.setdefault(self.machine.pk, set())
            if len(mine) >= MAX_FOLLOWERS_PER_MACHINE:
                raise TooManyFollowers(
                    f"{len(mine)} log streams are already open on this machine; "
                    "use the tail view or try again shortly."
                )
            mine.add(self)
        try:
            super().start()
        except BaseException:
            self._leave()
            raise

    def _leave(self) -> None:
        with _following_lock:
            mine = _following.get(self.machine.pk)
            if mine is not None:
                mine.discard(self)
                if not mine:
                    del _following[self.machine.pk]

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            channel = self._channel
        if channel is not None:
            channel.close()  # the blocked read returns now, and the session is freed

    def _opened(self, channel) -> None:
        with self._lock:
            self._channel = channel
        if self._stopped.is_set():  # stopped while the stream was being opened
            channel.close()

    def take(self) -> tuple[list[str], int]:
        """The lines waiting (oldest first) and how many were dropped since the last take."""
        with self._lock:
            lines, dropped = list(self._lines), self._dropped
            self._lines.clear()
            self._dropped = 0
        return lines, dropped

    def _deliver(self, line: str) -> None:
        with self._lock:
            if len(self._lines) == self._lines.maxlen:
                self._dropped += 1
            self._lines.append(line)
        self.wake()

    def _finish(self, reason: str) -> None:
        if not self._stopped.is_set():
            self.end_reason = reason
            self.wake()

    def run(self) -> None:
        host = DockerHost(self.machine)
        tail = self.tail
        try:
            while not self._stopped.is_set():
                last_heard = time.monotonic()
                try:
                    lines = host.logs_follow(
                        self.container, tail=tail, timeout=IDLE_SECONDS, on_channel=self._opened
                    )
                    for line in lines:
                        if self._stopped.is_set():
                            return  # closes the stream and gives its session back
                        self._deliver(line)
                        last_heard = time.monotonic()
                except HostBusy:
                    self._finish(
                        "The machine has no free session to follow logs now; "
                        "use the tail view or try again shortly."
                    )
                    return
                except (CommandFailed, HostKeyMismatch) as error:
                    self._finish(f"Could not follow the logs: {error}")
                    return
                except HostUnreachable as error:
                    if time.monotonic() - last_heard < IDLE_SECONDS * 0.9:
                        self._finish(f"Could not follow the logs: {error}")
                        return
                    tail = 0  # only quiet for a while: follow on from here
                    continue
                self._finish("The container stopped.")
                return
        except Exception:
            logger.exception("following the logs of %s failed", self.container)
            self._finish("Following the logs failed; use the tail view.")
        finally:
            self._leave()
