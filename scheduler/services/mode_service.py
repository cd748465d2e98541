"""Whether a launch mode's service answers yet: sshd (or Jupyter) listening in the container.

An SSH launch's bootstrap makes host keys before it starts sshd, which takes a second or two
after the container starts; an instance shown *running* then refuses the renter's first
``ssh``. So a launch stays *launching*, saying "Starting sshd", until the service listens on
its port inside the container, and only then becomes running.

Asked inside the container's own network namespace, from its ``/proc/net/tcp`` and ``tcp6``:
any image with a shell has them, and the answer does not depend on how the host reaches the
container. One ``docker exec`` over the pooled connection per look.
"""

from __future__ import annotations

import time

from hosts.runtime import DockerHost
from scheduler.models import Instance, LaunchMode
from scheduler.services.container_spec import (
    JUPYTER_CONTAINER_PORT,
    MODE_PROGRAMS,
    SSH_CONTAINER_PORT,
)
from scheduler.services.errors import LaunchModeUnavailable
from scheduler.services.transitions import instance_report_progress

MODE_PORTS = {LaunchMode.SSH: SSH_CONTAINER_PORT, LaunchMode.JUPYTER: JUPYTER_CONTAINER_PORT}
# How long a launch waits for the service; past it the instance runs anyway, saying so (a
# slow first start of Jupyter, say: the container is up and may answer later).
SERVICE_WAIT_SECONDS = 60
LOOK_EVERY_SECONDS = 0.25
TCP_LISTEN = "0A"
STARTING_PROGRESS = 95


def listening_ports(proc_net_tcp: str) -> set[int]:
    """The ports listened on, from the text of ``/proc/net/tcp`` and ``/proc/net/tcp6``."""
    ports = set()
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) < 4 or ":" not in fields[1] or fields[3] != TCP_LISTEN:
            continue
        try:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except ValueError:
            continue
    return ports


def mode_service_wait(host: DockerHost, instance: Instance, container_id: str) -> str:
    """Wait until the launch mode's service listens in the container; returns what to say
    when the instance becomes running. Raises LaunchModeUnavailable when the container exits
    first (the service died at start), LaunchInterrupted when the renter stopped or destroyed
    the instance meanwhile."""
    port = MODE_PORTS.get(instance.launch_mode)
    if port is None:
        return "Container started"
    program = MODE_PROGRAMS[instance.launch_mode][0]
    instance_report_progress(
        instance=instance, progress=STARTING_PROGRESS, message=f"Starting {program}"
    )
    deadline = time.monotonic() + SERVICE_WAIT_SECONDS
    while True:
        found = host.exec(
            container_id, ["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"], timeout=30
        )
        if port in listening_ports(found.stdout):
            return f"Container started; {program} answers"
        if found.exit_code != 0:
            state = host.inspect(container_id).get("State", {})
            if not state.get("Running"):
                raise LaunchModeUnavailable(
                    f"{program} exited at start (exit code {state.get('ExitCode')}); see the logs"
                )
        if time.monotonic() >= deadline:
            return f"Container started; {program} did not answer within {SERVICE_WAIT_SECONDS} s"
        time.sleep(LOOK_EVERY_SECONDS)
