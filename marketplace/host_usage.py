"""A machine's usage as its provider sees it: each GPU free or rented (by which of the
provider's own instances; another team's rental is only "rented"), its utilization now, and
the host port range with the ports rentals hold. Joins hosts (GPUs, the port range, a live
nvidia-smi read) with the scheduler's allocations, which only marketplace may do."""

from __future__ import annotations

from hosts.models import Machine
from hosts.probe import gpu_utilization
from hosts.ssh import HostError
from scheduler.models import GpuAllocation, GpuSlice, PortAllocation


def _holder(instance_team_id: int, instance_id: int, viewer_team_id: int) -> int | None:
    """The instance's id when it is the viewer's own, else None (shown as "rented")."""
    return instance_id if instance_team_id == viewer_team_id else None


def machine_gpu_usage(machine: Machine, *, viewer_team_id: int) -> dict:
    held = {
        gpu_id: (team_id, instance_id)
        for gpu_id, team_id, instance_id in GpuAllocation.objects.filter(
            released_at=None, gpu__machine=machine
        ).values_list("gpu_id", "instance__team_id", "instance_id")
    }
    slices: dict[int, list[dict]] = {}
    for gpu_id, team_id, instance_id, core, memory in GpuSlice.objects.filter(
        released_at=None, gpu__machine=machine
    ).values_list("gpu_id", "instance__team_id", "instance_id", "core_percent", "memory_mb"):
        slices.setdefault(gpu_id, []).append(
            {
                "instance_id": _holder(team_id, instance_id, viewer_team_id),
                "core_percent": core,
                "memory_mb": memory,
            }
        )
    try:
        utilization, note = gpu_utilization(machine), ""
    except (HostError, OSError) as error:
        utilization, note = {}, f"Utilization could not be read: {error}"
    gpus = []
    for gpu in machine.gpus.filter(present=True).order_by("index"):
        percent, memory_used = utilization.get(gpu.uuid, (None, None))
        holder = held.get(gpu.pk)
        sliced = slices.get(gpu.pk, [])
        gpus.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "memory_mib": gpu.memory_mib,
                "state": "rented" if holder else "sliced" if sliced else "free",
                "instance_id": _holder(*holder, viewer_team_id) if holder else None,
                # A shared card's slices (another team's named by size only).
                "slices": sliced,
                "utilization_percent": percent,
                "memory_used_mib": memory_used,
            }
        )
    return {
        "machine_id": machine.pk,
        "total": len(gpus),
        "rented": sum(1 for gpu in gpus if gpu["state"] == "rented"),
        "sliced": sum(1 for gpu in gpus if gpu["state"] == "sliced"),
        "free": sum(1 for gpu in gpus if gpu["state"] == "free"),
        "gpus": gpus,
        "message": note,
    }


def machine_port_usage(machine: Machine, *, viewer_team_id: int) -> dict:
    rows = (
        PortAllocation.objects.filter(machine=machine, released_at=None)
        .order_by("host_port")
        .values_list("host_port", "container_port", "protocol", "instance__team_id", "instance_id")
    )
    used = [
        {
            "host_port": host_port,
            "container_port": container_port,
            "protocol": protocol,
            "instance_id": _holder(team_id, instance_id, viewer_team_id),
        }
        for host_port, container_port, protocol, team_id, instance_id in rows
    ]
    total = machine.port_range_end - machine.port_range_start + 1
    in_range = sum(
        1
        for port in used
        if machine.port_range_start <= port["host_port"] <= machine.port_range_end
    )
    return {
        "machine_id": machine.pk,
        "range_start": machine.port_range_start,
        "range_end": machine.port_range_end,
        "total": total,
        "used": len(used),
        "free": total - in_range,
        "ports": used,
    }
