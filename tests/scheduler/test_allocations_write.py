"""The scheduler writes a batch's allocations with core's bulk insert (binary COPY on
PostgreSQL): every row lands with its id, and a GPU or port that is taken meanwhile is still
a clean refusal that writes nothing."""

from __future__ import annotations

import pytest

from scheduler.models import GpuAllocation, Instance, PortAllocation
from scheduler.services import NoCapacity, allocations_write
from tests.factories import TeamFactory
from tests.marketplace.test_deployment_placing import paper_machine

pytestmark = pytest.mark.django_db


def instances(count: int):
    provider, renter = TeamFactory(name="Provider"), TeamFactory(name="Renter")
    machine = paper_machine(provider, gpus=2)
    made = [
        Instance.objects.create(team=renter, machine=machine, gpu_count=1, image="x")
        for _ in range(count)
    ]
    return machine, list(machine.gpus.order_by("index")), made


def test_a_batch_of_allocations_is_written_with_ids():
    machine, gpus, (first, second) = instances(2)

    allocations_write(
        [(first, [gpus[0].pk], [(22, 40001)], None), (second, [gpus[1].pk], [(22, 40002)], None)]
    )

    assert sorted(GpuAllocation.objects.values_list("instance_id", "gpu_id")) == [
        (first.pk, gpus[0].pk),
        (second.pk, gpus[1].pk),
    ]
    ports = PortAllocation.objects.order_by("host_port")
    assert [(p.instance_id, p.machine_id, p.host_port, p.container_port) for p in ports] == [
        (first.pk, machine.pk, 40001, 22),
        (second.pk, machine.pk, 40002, 22),
    ]
    assert all(p.created_at is not None and p.released_at is None for p in ports)


def test_a_gpu_taken_meanwhile_refuses_the_batch_and_writes_none_of_it():
    _, gpus, (holder, first, second) = instances(3)
    allocations_write([(holder, [gpus[0].pk], [], None)])

    with pytest.raises(NoCapacity):
        allocations_write(
            [(first, [gpus[1].pk], [(22, 40001)], None), (second, [gpus[0].pk], [], None)]
        )

    assert list(GpuAllocation.objects.values_list("instance_id", flat=True)) == [holder.pk]
    assert not PortAllocation.objects.exists()
