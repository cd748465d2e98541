"""Allocations of GPUs and host ports to instances.

Allocation happens inside the caller's transaction with the machine row locked, so two renters
racing for the last GPU are serialized; the partial unique constraints on the allocation tables
are the backstop. ``live_gpu_allocations`` is the one query for GPUs held now.
"""

from __future__ import annotations

from collections import defaultdict

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from hosts.models import Gpu, Machine
from hosts.ports import pick_free_ports
from scheduler.models import GpuAllocation, Instance, PortAllocation
from scheduler.services.errors import NoCapacity


def live_gpu_allocations() -> QuerySet[GpuAllocation]:
    return GpuAllocation.objects.filter(released_at=None)


class MachineRoom:
    """What is free on locked machines now: their present GPUs no live allocation holds (in
    index order) and their host ports in use, read in two statements for any number of
    machines. ``take`` hands out GPUs and ports in memory, so a batch of rentals on one machine
    never gets the same GPU or port twice; ``allocations_write`` writes what was taken.

    The caller holds the machines' row locks (``select_for_update``) in its transaction, so
    what is read stays true until it commits; the partial unique constraints on the
    allocation tables are the backstop.
    """

    def __init__(self, machines: list[Machine]):
        ids = [machine.pk for machine in machines]
        self._machines = {machine.pk: machine for machine in machines}
        taken = live_gpu_allocations().filter(gpu=OuterRef("pk"))
        self.present: dict[int, int] = defaultdict(int)
        self._gpu_order: dict[int, list[int]] = defaultdict(list)
        self.free_gpu_ids: dict[int, list[int]] = defaultdict(list)
        gpus = (
            Gpu.objects.filter(machine_id__in=ids, present=True)
            .annotate(taken=Exists(taken))
            .order_by("machine_id", "index")
            .values_list("machine_id", "pk", "taken")
        )
        for machine_id, gpu_id, is_taken in gpus:
            self.present[machine_id] += 1
            self._gpu_order[machine_id].append(gpu_id)
            if not is_taken:
                self.free_gpu_ids[machine_id].append(gpu_id)
        self.used_ports: dict[int, set[int]] = defaultdict(set)
        used = PortAllocation.objects.filter(machine_id__in=ids, released_at=None).values_list(
            "machine_id", "host_port"
        )
        for machine_id, port in used:
            self.used_ports[machine_id].add(port)

    def take(
        self, machine_id: int, gpu_count: int, container_ports: list[int]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """(GPU ids, [(container port, host port)]) for one rental, or NoCapacity (nothing
        taken)."""
        free = self.free_gpu_ids[machine_id]
        if len(free) < gpu_count:
            raise NoCapacity(
                f"Only {len(free)} GPU(s) of machine {machine_id} are free now; "
                f"{gpu_count} were asked for."
            )
        machine = self._machines[machine_id]
        used = self.used_ports[machine_id]
        host_ports = pick_free_ports(
            machine.port_range_start, machine.port_range_end, used, len(container_ports)
        )
        if len(host_ports) < len(container_ports):
            raise NoCapacity(f"Machine {machine_id} has no free host ports left.")
        gpu_ids = free[:gpu_count]
        del free[:gpu_count]
        used.update(host_ports)
        return gpu_ids, list(zip(container_ports, host_ports, strict=True))

    def give_back(self, machine_id: int, gpu_ids: list[int], ports: list[tuple[int, int]]) -> None:
        """Undo a ``take`` whose rental was refused after all (short of credit)."""
        index = {gpu_id: n for n, gpu_id in enumerate(self._gpu_order[machine_id])}
        free = self.free_gpu_ids[machine_id]
        free[:] = sorted({*free, *gpu_ids}, key=index.__getitem__)
        self.used_ports[machine_id].difference_update(host_port for _, host_port in ports)


def allocations_write(
    rows: list[tuple[Instance, list[int], list[tuple[int, int]]]],
) -> None:
    """Write the GPU and port allocations ``MachineRoom.take`` handed out: (instance, GPU ids,
    [(container port, host port)]) per rental, in two statements."""
    try:
        with transaction.atomic():  # savepoint: a constraint violation is a clean 409
            GpuAllocation.objects.bulk_create(
                [
                    GpuAllocation(instance=instance, gpu_id=gpu_id)
                    for instance, gpu_ids, _ in rows
                    for gpu_id in gpu_ids
                ]
            )
            PortAllocation.objects.bulk_create(
                [
                    PortAllocation(
                        instance=instance,
                        machine_id=instance.machine_id,
                        host_port=host_port,
                        container_port=container_port,
                    )
                    for instance, _, ports in rows
                    for container_port, host_port in ports
                ]
            )
    except IntegrityError as error:
        raise NoCapacity("The GPUs were taken by another rental a moment ago.") from error


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
