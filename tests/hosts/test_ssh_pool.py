"""The SSH pool against simulated hosts: bounded sessions, streams apart from commands,
per-machine connects, no re-run of a command cut off midway, no lingering failed logins.

The commands that hold a session wait for a file the test creates (the simulated host runs
on this machine), so the tests synchronise on events, never on durations.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import paramiko
import pytest

from hosts import ssh
from hosts.models import Machine
from tests.hosts.support import online_machine

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def wait_for(path: Path, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def held(started: Path, release: Path) -> list[str]:
    """A command that says it started, then holds its session until ``release`` exists."""
    script = f'touch "{started}"; while [ ! -e "{release}" ]; do sleep 0.05; done; echo done'
    return ["sh", "-c", script]


class Background(threading.Thread):
    def __init__(self, target):
        super().__init__(daemon=True)
        self._target_fn, self.result, self.error = target, None, None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except Exception as error:  # noqa: BLE001 - handed to the test
            self.error = error


def test_commands_beyond_the_budget_get_host_busy_and_nothing_runs(team, sim_host, tmp_path):
    machine = online_machine(team, sim_host)
    pool = ssh.Pool(max_commands=2, wait_seconds=0.5)
    release = tmp_path / "release"
    holders = [
        Background(lambda n=n: pool.run(machine, held(tmp_path / f"started-{n}", release)))
        for n in range(2)
    ]
    try:
        for holder in holders:
            holder.start()
        for n in range(2):
            wait_for(tmp_path / f"started-{n}")
        marker = tmp_path / "third-ran"
        with pytest.raises(ssh.HostBusy, match="no free SSH session"):
            pool.run(machine, ["touch", str(marker)])
        assert not marker.exists()
    finally:
        release.touch()
        for holder in holders:
            holder.join(30)
    assert [h.result.stdout for h in holders] == ["done\n", "done\n"]
    assert pool.run(machine, ["echo", "free again"]).stdout == "free again\n"
    pool.close_all()


def test_a_long_stream_does_not_starve_short_commands(team, sim_host, tmp_path):
    machine = online_machine(team, sim_host)
    pool = ssh.Pool(max_commands=1, max_streams=1, wait_seconds=0.5)
    release = tmp_path / "release"
    lines: list[str] = []
    follower = Background(
        lambda: lines.extend(pool.stream(machine, held(tmp_path / "following", release)))
    )
    try:
        follower.start()
        wait_for(tmp_path / "following")
        # The stream holds its session; heartbeats and other commands still get theirs.
        assert pool.run(machine, ["echo", "heartbeat"]).stdout == "heartbeat\n"
        assert pool.run(machine, ["echo", "again"]).stdout == "again\n"
        # A second stream waits for the streams' budget and gives up with HostBusy.
        with pytest.raises(ssh.HostBusy):
            next(pool.stream(machine, ["echo", "second stream"]))
    finally:
        release.touch()
        follower.join(30)
        pool.close_all()
    assert follower.error is None and lines == ["done"]


@contextlib.contextmanager
def silent_server():
    """A TCP port that accepts and then says nothing: a machine hanging in its SSH banner."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []
    arrived = threading.Event()

    def accept():
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            accepted.append(conn)
            arrived.set()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1], arrived
    finally:
        for conn in accepted:
            conn.close()
        server.close()


def test_a_slow_connect_to_one_machine_does_not_hold_up_another(team, sim_host, tmp_path):
    machine = online_machine(team, sim_host)
    pool = ssh.Pool(connect_timeout=60)
    with silent_server() as (port, arrived):
        hanging = Machine.objects.create(
            team=team, name="hanging", address="127.0.0.1", port=port, ssh_user="root",
            host_key_type=machine.host_key_type, host_key=machine.host_key, status="online",
        )  # fmt: skip
        stuck = Background(lambda: pool.run(hanging, ["true"]))
        stuck.start()
        assert arrived.wait(30)
        # The other machine connects and runs while the first connect still hangs.
        assert pool.run(machine, ["echo", "meanwhile"]).stdout == "meanwhile\n"
        assert stuck.is_alive()
    stuck.join(30)  # the silent machine hung up: its connect fails now
    assert isinstance(stuck.error, ssh.HostUnreachable)
    pool.close_all()


def test_a_command_cut_off_midway_is_not_run_again(team, sim_host_factory, tmp_path):
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    pool = ssh.Pool()
    runs, release = tmp_path / "runs", tmp_path / "release"
    script = f'echo run >> "{runs}"; while [ ! -e "{release}" ]; do sleep 0.05; done'
    launch = Background(lambda: pool.run(machine, ["sh", "-c", script]))
    launch.start()
    try:
        wait_for(runs)
        host.stop()  # the connection drops while the command runs
        host.start()  # and the machine is back at once: a retry would reach it
        launch.join(30)
    finally:
        release.touch()
        launch.join(30)
        pool.close_all()
    assert isinstance(launch.error, ssh.HostUnreachable)
    assert "may or may not have finished" in str(launch.error)
    assert runs.read_text() == "run\n"  # exactly once


def test_a_command_on_a_stale_connection_runs_on_a_new_one(team, sim_host_factory):
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    pool = ssh.Pool()
    assert pool.run(machine, ["true"]).exit_code == 0
    host.stop()
    host.start()
    # The pooled connection is dead; `true` never started on it, so it runs on a new one.
    assert pool.run(machine, ["echo", "ok"]).stdout == "ok\n"
    pool.close_all()


def test_a_refused_login_leaves_no_connection_behind(team, sim_host):
    machine = online_machine(team, sim_host)

    def transports() -> set[paramiko.Transport]:
        return {t for t in threading.enumerate() if isinstance(t, paramiko.Transport)}

    before = transports()
    for _ in range(3):
        with pytest.raises(ssh.HostUnreachable, match="refused the platform's key"):
            ssh.Connection(
                address=machine.address, port=machine.port, user="gpumkt-no-such-user",
                team_id=machine.team_id, key_type=machine.host_key_type,
                key_base64=machine.host_key,
            )  # fmt: skip
    for transport in transports() - before:
        transport.join(10)
    assert not {t for t in transports() - before if t.is_alive()}
