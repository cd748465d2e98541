"""The container an instance runs, and whether its image can serve its launch mode."""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from hosts.models import Gpu
from hosts.runtime import ContainerSpec, DockerHost, GpuSliceSpec
from scheduler.models import GpuAllocation, Instance, LaunchMode
from scheduler.placement import slice_fraction
from scheduler.services.allocations import instance_gpu_uuids, live_gpu_slices
from scheduler.services.errors import LaunchModeUnavailable

SSH_CONTAINER_PORT = 22
JUPYTER_CONTAINER_PORT = 8888

# Launch modes for images that bring their own sshd / Jupyter. The keys arrive in an env var,
# never pasted into a command line. An image without the program exits with MISSING_PROGRAM
# and a line saying so, and the launch fails with that reason (instance_launch checks): a
# container that only sleeps behind an ssh line or a token URL would be a lie.
MISSING_PROGRAM = 78
MISSING_SSHD = "image has no sshd; use an image with an OpenSSH server installed"
MISSING_JUPYTER = "image has no jupyter; use an image with Jupyter installed"
SSH_BOOTSTRAP = (
    'mkdir -p /root/.ssh && printf "%s\\n" "$GPUMKT_SSH_AUTHORIZED_KEYS" '
    "> /root/.ssh/authorized_keys && chmod 700 /root/.ssh && chmod 600 /root/.ssh/authorized_keys; "
    "if command -v sshd >/dev/null; then mkdir -p /run/sshd /etc/ssh; "
    "ls /etc/ssh/ssh_host_*_key >/dev/null 2>&1 || ssh-keygen -A >&2; "
    "exec $(command -v sshd) -D -e; "
    f"else echo '{MISSING_SSHD}' >&2; exit {MISSING_PROGRAM}; fi"
)
JUPYTER_BOOTSTRAP = (
    "if command -v jupyter >/dev/null; then exec jupyter lab --ip=0.0.0.0 --port=8888 "
    '--allow-root --no-browser --ServerApp.token="$JUPYTER_TOKEN"; '
    f"else echo '{MISSING_JUPYTER}' >&2; exit {MISSING_PROGRAM}; fi"
)
# What a launch mode's bootstrap runs, and what a launch says when the image lacks it.
MODE_PROGRAMS = {
    LaunchMode.SSH: ("sshd", MISSING_SSHD),
    LaunchMode.JUPYTER: ("jupyter", MISSING_JUPYTER),
}


def extra_container_labels() -> dict[str, str]:
    return dict(getattr(settings, "CONTAINER_EXTRA_LABELS", {}))


def container_spec_for(
    instance: Instance,
    *,
    ssh_keys: list[str] | None = None,
    team_env: dict[str, str] | None = None,
) -> ContainerSpec:
    """The container an instance runs: its units' limits, pinned GPUs, published ports. A slice
    gets its fraction of one unit, is pinned to its card and carries the MPS limits.
    ``team_env``: the team's variables, under the instance's own (its env wins a name)."""
    machine = instance.machine
    gpu_uuids = None
    if getattr(machine, "present_gpu_count", None) is None:
        # Counted once here: the unit's CPUs, memory and shared memory below each divide by it.
        if instance.is_slice:
            machine.present_gpu_count = machine.gpus.filter(present=True).count()
        else:
            machine.present_gpu_count, gpu_uuids = _present_count_and_uuids(instance)
    n = instance.gpu_count
    gpu_slice = None
    if instance.is_slice:
        gpu_slice = GpuSliceSpec(instance.slice_core_percent, instance.slice_memory_mb)
        card_memory = (
            live_gpu_slices()
            .filter(instance=instance)
            .values_list("gpu__memory_mib", flat=True)
            .first()
        )
        n = slice_fraction(gpu_slice.core_percent, gpu_slice.memory_mb, card_memory or 1)
    env = {**(team_env or {}), **instance.env}
    args = list(instance.args)
    entrypoint = instance.entrypoint or None
    if instance.launch_mode == LaunchMode.SSH:
        env["GPUMKT_SSH_AUTHORIZED_KEYS"] = "\n".join(ssh_keys or [])
        if not args and not entrypoint:
            entrypoint, args = "sh", ["-c", SSH_BOOTSTRAP]
    elif instance.launch_mode == LaunchMode.JUPYTER:
        env["JUPYTER_TOKEN"] = instance.jupyter_token
        if not args and not entrypoint:
            entrypoint, args = "sh", ["-c", JUPYTER_BOOTSTRAP]
    ports = list(
        instance.port_allocations.filter(released_at=None)
        .order_by("container_port")
        .values_list("container_port", "host_port", "protocol")
    )
    labels = {
        "gpumkt.instance": str(instance.uuid),
        "gpumkt.team": str(instance.team_id),
        **extra_container_labels(),
    }
    return ContainerSpec(
        name=instance.container_name,
        image=instance.image,
        labels=labels,
        env=env,
        ports=ports,
        cpus=max(round(float(machine.unit_cpus * n), 2), 0.01),
        memory_mb=max(int(machine.unit_memory_mb * n), 6),
        shm_mb=max(int(machine.unit_shm_mb * n), 1),
        gpu_uuids=instance_gpu_uuids(instance) if gpu_uuids is None else gpu_uuids,
        gpu_slice=gpu_slice,
        entrypoint=entrypoint,
        args=args,
        volumes=[(name, target) for name, target in instance.volumes],
        # Recorded on the container as a label, and capped where the host's storage driver can
        # (the probe's disk_enforced; see hosts.runtime.container_spec.DISK_LABEL).
        disk_gb=instance.disk_gb,
        disk_enforced=machine.disk_enforced,
    )


def _present_count_and_uuids(instance: Instance) -> tuple[int, list[str]]:
    """How many GPUs the instance's machine has present, and the uuids of the whole GPUs the
    instance holds in index order (``instance_gpu_uuids``), in one statement instead of two."""
    with connection.cursor() as cursor:
        cursor.execute(_PRESENT_AND_HELD_SQL, [instance.pk, instance.machine_id])
        rows = cursor.fetchall()
    return sum(1 for present, _, _ in rows if present), [uuid for _, held, uuid in rows if held]


_PRESENT_AND_HELD_SQL = f"""
SELECT g.present, a.id IS NOT NULL AS held, g.uuid
  FROM {Gpu._meta.db_table} g
  LEFT JOIN {GpuAllocation._meta.db_table} a
    ON a.gpu_id = g.id AND a.released_at IS NULL AND a.instance_id = %s
 WHERE g.machine_id = %s AND (g.present OR a.id IS NOT NULL)
 ORDER BY g."index"
"""  # noqa: S608  (table names from the models; values are parameters)


def check_launch_mode(host: DockerHost, instance: Instance, container_id: str) -> None:
    """Raise LaunchModeUnavailable when the image lacks the mode's program.

    Asked inside the container (``command -v``), so the answer does not depend on how fast
    the bootstrap gets to its own check. A container that already exited tells by its exit
    code which of the two it was: the program missing, or the program dying at once. Asked
    with the renter's own command too: without the program the mode's line is no use.
    """
    if instance.launch_mode not in MODE_PROGRAMS:
        return
    program, missing = MODE_PROGRAMS[instance.launch_mode]
    found = host.exec(container_id, ["sh", "-c", f"command -v {program}"], timeout=30)
    if found.exit_code == 0:
        return
    state = host.inspect(container_id).get("State", {})
    if state.get("Running") or state.get("ExitCode") == MISSING_PROGRAM:
        raise LaunchModeUnavailable(missing)
    raise LaunchModeUnavailable(
        f"{program} exited at once (exit code {state.get('ExitCode')}); see the logs"
    )
