"""A host port a rental gave back rests before the next rental on the machine gets it
(hosts/ports.py): the old tenant's gateway route, or a client of the old address, must not
reach the next tenant's container. Resting delays reuse and never refuses a rental."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hosts.ports import PORT_REST
from scheduler.models import Instance, PortAllocation
from scheduler.services import FreeCapacity, NoCapacity, allocations_write
from tests.factories import TeamFactory
from tests.marketplace.test_deployment_placing import paper_machine

pytestmark = pytest.mark.django_db


def machine_with_ports(*released_ago: timedelta | None):
    """A machine whose first ports were published by rentals, each given back ``released_ago``
    (None: still live)."""
    machine = paper_machine(TeamFactory(name="Provider"), gpus=1)
    renter = TeamFactory(name="Renter")
    for n, ago in enumerate(released_ago):
        instance = Instance.objects.create(team=renter, machine=machine, gpu_count=0, image="x")
        allocations_write([(instance, [], [(8080, machine.port_range_start + n)], None)])
        if ago is not None:
            PortAllocation.objects.filter(instance=instance).update(
                released_at=timezone.now() - ago
            )
    return machine


def next_ports(machine, count: int = 1) -> list[int]:
    _, pairs = FreeCapacity([machine]).take(machine.pk, 0, [8000 + n for n in range(count)])
    return [host for _, host in pairs]


def test_a_port_given_back_is_not_the_next_rentals():
    machine = machine_with_ports(timedelta(seconds=1), None)
    start = machine.port_range_start

    assert next_ports(machine, 2) == [start + 2, start + 3]


def test_a_port_rested_long_enough_is_reused():
    machine = machine_with_ports(PORT_REST + timedelta(seconds=5), None)

    assert next_ports(machine) == [machine.port_range_start]


def test_a_range_with_only_resting_ports_left_rents_the_longest_rested_first():
    machine = machine_with_ports(timedelta(minutes=1), timedelta(minutes=3), None)
    start = machine.port_range_start
    machine.port_range_end = start + 2
    machine.save(update_fields=["port_range_end"])

    assert next_ports(machine, 2) == [start + 1, start]
    with pytest.raises(NoCapacity):  # a third: none is free, resting or not
        next_ports(machine, 3)
