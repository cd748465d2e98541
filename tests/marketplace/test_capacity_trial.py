"""An order's takes from a machine's free capacity are a trial: committed when the order is
accepted, dropped when it is refused, as if it had never been tried (renting.py takes every
order in one; ``FreeCapacity`` in scheduler/services/allocations.py)."""

from __future__ import annotations

import dataclasses

import pytest
from django.db import transaction

from billing.errors import InsufficientCredit
from hosts.models import Machine
from marketplace.rentals.renting import rentals_create
from scheduler.models import GpuAllocation, GpuSlice
from scheduler.services import FreeCapacity, NoCapacity
from tests.factories import TeamFactory
from tests.marketplace.test_gpu_slices import (
    CARD_MB,
    funded_teams,
    sharing_machine,
    slice_order,
    whole_order,
)


def capacity_state(capacity: FreeCapacity, machine_id: int):
    """What a trial may change: the free GPUs in order, the cards with what is free on
    them, the host ports in use."""
    return (
        list(capacity.free_gpu_ids[machine_id]),
        [(c.gpu_id, c.free_core, c.free_memory_mb) for c in capacity.cards.get(machine_id, [])],
        set(capacity.used_ports[machine_id]),
    )


@pytest.mark.django_db
def test_a_dropped_trial_leaves_the_machine_as_it_was_and_a_committed_one_keeps_its_takes(
    sim_host, provider_team
):
    machine = sharing_machine(sim_host, provider_team, gpus=3)
    with transaction.atomic():
        locked = list(Machine.objects.select_for_update().filter(pk=machine.pk))
        capacity = FreeCapacity(locked)
        before = capacity_state(capacity, machine.pk)
        assert len(before[0]) == 3 and len(before[1]) == 3

        # Everything a trial can do, then a refusal: all of it is put back.
        with pytest.raises(NoCapacity), capacity.trial(machine.pk) as trial:
            trial.lend([999])
            trial.take(1, [22, 8080])
            trial.take_slice(30, 1000)
            trial.take(5, [])  # more than is free: refused
        assert capacity_state(capacity, machine.pk) == before

        # Not committed, nothing raised: dropped all the same.
        with capacity.trial(machine.pk) as trial:
            trial.take(2, [22])
        assert capacity_state(capacity, machine.pk) == before

        with capacity.trial(machine.pk) as trial:
            gpu_ids, ports = trial.take(1, [22])
            slice_ = trial.take_slice(50, 2000)
            trial.commit()
        free, cards, used = capacity_state(capacity, machine.pk)
        assert gpu_ids[0] not in free and slice_.gpu_id not in free
        assert [c for c in cards if c[0] == slice_.gpu_id] == [(slice_.gpu_id, 50, CARD_MB - 2000)]
        assert gpu_ids[0] not in [c[0] for c in cards]
        assert used == before[2] | {ports[0][1]}


@pytest.mark.django_db
def test_an_order_refused_for_credit_leaves_its_card_to_the_next_order_in_the_batch(
    sim_host, provider_team
):
    # One card. The first order (no credit) takes it whole and is refused for credit; the
    # card must be there again for the second order's slice. (A refusal used to give back
    # the GPU but not the card: the slice was refused with a 409 on a free card.)
    machine = sharing_machine(sim_host, provider_team, gpus=1)
    poor = TeamFactory()
    [funded] = funded_teams(1)
    outcomes = rentals_create(
        [(poor, whole_order(machine, 1)), (funded, slice_order(machine, 50, 1000))]
    )
    assert isinstance(outcomes[0], InsufficientCredit)
    assert not isinstance(outcomes[1], Exception), outcomes[1]
    assert GpuAllocation.objects.filter(gpu__machine=machine).count() == 0
    assert GpuSlice.objects.get(gpu__machine=machine).instance == outcomes[1].instance


@pytest.mark.django_db
def test_a_slice_refused_for_its_disk_leaves_its_card_whole_for_the_next_order(
    sim_host, provider_team
):
    machine = sharing_machine(sim_host, provider_team, gpus=1)
    first, second = funded_teams(2)
    too_much_disk = dataclasses.replace(slice_order(machine, 10, 1000), disk_gb=10_000)
    outcomes = rentals_create([(first, too_much_disk), (second, whole_order(machine, 1))])
    assert "disk_gb" in outcomes[0].message_dict
    assert GpuAllocation.objects.get(gpu__machine=machine).instance == outcomes[1].instance
    assert not GpuSlice.objects.filter(gpu__machine=machine).exists()
