"""Allocations of GPUs and host ports to instances.

Allocation happens inside the caller's transaction with the machine row locked, so two renters
racing for the last GPU are serialized; the partial unique constraints on the allocation tables
are the backstop. ``live_gpu_allocations`` is the one query for GPUs held now.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from hosts.models import Gpu, Machine
from hosts.ports import pick_free_ports
from scheduler.models import GpuAllocation, Instance, PortAllocation
from scheduler.services.errors import NoCapacity


def live_gpu_allocations() -> QuerySet[GpuAllocation]:
    return GpuAllocation.objects.filter(released_at=None)


def free_gpus(machine: Machine) -> QuerySet[Gpu]:
    """Present GPUs of the machine that no live allocation holds."""
    taken = live_gpu_allocations().filter(gpu=OuterRef("pk"))
    return machine.gpus.filter(present=True).exclude(Exists(taken)).order_by("index")


def allocation_create(
    *, machine: Machine, instance: Instance, gpu_count: int, container_ports: list[int]
) -> tuple[list[Gpu], list[PortAllocation]]:
    """Take ``gpu_count`` free GPUs and one host port per container port.

    The caller holds the machine row lock (``select_for_update``) in its transaction.
    """
    gpus = list(free_gpus(machine)[:gpu_count])
    if len(gpus) < gpu_count:
        raise NoCapacity(
            f"Only {len(gpus)} GPU(s) of machine {machine.pk} are free now; "
            f"{gpu_count} were asked for."
        )
    used = set(
        PortAllocation.objects.filter(machine=machine, released_at=None).values_list(
            "host_port", flat=True
        )
    )
    host_ports = pick_free_ports(
        machine.port_range_start, machine.port_range_end, used, len(container_ports)
    )
    if len(host_ports) < len(container_ports):
        raise NoCapacity(f"Machine {machine.pk} has no free host ports left.")
    try:
        with transaction.atomic():  # savepoint: a constraint violation is a clean 409
            GpuAllocation.objects.bulk_create(
                [GpuAllocation(instance=instance, gpu=gpu) for gpu in gpus]
            )
            ports = PortAllocation.objects.bulk_create(
                [
                    PortAllocation(
                        instance=instance, machine=machine, host_port=hp, container_port=cp
                    )
                    for cp, hp in zip(container_ports, host_ports, strict=True)
                ]
            )
    except IntegrityError as error:
        raise NoCapacity("The GPUs were taken by another rental a moment ago.") from error
    return gpus, ports


def gpu_allocation_release(*, instance: Instance) -> int:
    return live_gpu_allocations().filter(instance=instance).update(released_at=timezone.now())


def allocation_release_all(*, instance: Instance) -> None:
    now = timezone.now()
    live_gpu_allocations().filter(instance=instance).update(released_at=now)
    PortAllocation.objects.filter(instance=instance, released_at=None).update(released_at=now)


def gpu_allocation_reclaim(*, instance: Instance) -> list[Gpu]:
    """Take back the GPUs a stopped instance had (its container is pinned to them).

    Raises NoCapacity when another rental holds one of them now. Locks the machine row.
    """
    Machine.objects.select_for_update().get(pk=instance.machine_id)
    last = (
        GpuAllocation.objects.filter(instance=instance)
        .exclude(released_at=None)
        .order_by("-released_at")
        .first()
    )
    if last is None:
        raise NoCapacity("This instance holds no GPUs to take back.")
    gpu_ids = list(
        GpuAllocation.objects.filter(instance=instance, released_at=last.released_at).values_list(
            "gpu_id", flat=True
        )
    )
    if live_gpu_allocations().filter(gpu_id__in=gpu_ids).exists():
        raise NoCapacity("Its GPUs are rented by someone else now; try again later.")
    gpus = list(Gpu.objects.filter(pk__in=gpu_ids, present=True).order_by("index"))
    if len(gpus) != len(gpu_ids):
        raise NoCapacity("One of its GPUs is missing from the machine.")
    try:
        with transaction.atomic():
            GpuAllocation.objects.bulk_create(
                [GpuAllocation(instance=instance, gpu=gpu) for gpu in gpus]
            )
    except IntegrityError as error:
        raise NoCapacity("Its GPUs were taken a moment ago.") from error
    return gpus


def instance_gpu_uuids(instance: Instance) -> list[str]:
    return list(
        live_gpu_allocations()
        .filter(instance=instance)
        .order_by("gpu__index")
        .values_list("gpu__uuid", flat=True)
    )
