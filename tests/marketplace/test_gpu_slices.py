"""Fractional GPUs: slices of a card (compute percent and memory) rented like any rental.

The card's bookkeeping is checked in the database (its triggers refuse what would overfill or
mix a card), the renting path in memory under the machine's lock, and the money in the ledger.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from billing.models import Hold
from hosts.models import Gpu
from marketplace.models import Offer, Rental
from marketplace.rentals.renting import RentalRequest, rental_create
from scheduler.models import GpuAllocation, GpuSlice, Instance
from scheduler.placement import SPREAD, SliceSize
from scheduler.services import NoCapacity
from tests.factories import TeamFactory
from tests.marketplace.conftest import PRICE_PER_GPU_HOUR, fund, machine_for

CARD_MB = 24564  # the simulated RTX 4090's memory


def sharing_machine(sim_host, provider_team, gpus: int = 1, **terms):
    """A listed machine on the shared simulated host that shares its cards, with ``gpus``
    of the host's cards (the rest removed from the row; the host has 4)."""
    machine = machine_for(
        sim_host, provider_team, mps_available=True, sharing_enabled=True, **terms
    )
    Gpu.objects.filter(machine=machine, index__gte=gpus).delete()
    from marketplace.services.offers import offer_refresh

    offer_refresh(machine_id=machine.pk)
    return machine


def slice_order(machine, core: int, memory: int, **fields) -> RentalRequest:
    return RentalRequest(
        machine_id=machine.pk,
        gpu_count=1,
        image="gpumkt/busybox:latest",
        hours=2,
        disk_gb=1,
        gpu_slice=SliceSize(core, memory),
        **fields,
    )


def funded_teams(n: int):
    teams = [TeamFactory() for _ in range(n)]
    for team in teams:
        fund(team, 50)
    return teams


def written() -> tuple[int, int, int, int]:
    return (
        Instance.objects.count(),
        Rental.objects.count(),
        GpuSlice.objects.count(),
        Hold.objects.count(),
    )


@pytest.mark.django_db
def test_four_quarters_fill_a_card_a_fifth_is_refused_and_memory_counts_too(
    sim_host, provider_team
):
    machine = sharing_machine(sim_host, provider_team, gpus=1)
    teams = funded_teams(6)
    rentals = [
        rental_create(team=t, request=slice_order(machine, 25, 6000)).rental for t in teams[:4]
    ]
    card = Gpu.objects.get(machine=machine)
    assert {r.instance.gpu_slices.get().gpu_id for r in rentals} == {card.pk}
    # Priced at the card's rate × the larger fraction: 25 % of compute beats 6000/24564 memory.
    assert {r.price_per_gpu_hour for r in rentals} == {PRICE_PER_GPU_HOUR // 4}
    assert {r.gpu_count for r in rentals} == {1}
    assert Hold.objects.get(pk=rentals[0].hold_id).amount == 2 * PRICE_PER_GPU_HOUR // 4 + 278
    offer = Offer.objects.get(machine=machine, all_free=True)
    assert offer.num_gpus == 0 and offer.gpu_frac == 0 and offer.slice_core_percent == 0
    assert offer.cards == [
        {"gpu_index": 0, "free_core_percent": 0, "free_memory_mb": CARD_MB - 24000,
         "memory_mb": CARD_MB}
    ]  # fmt: skip

    before = written()
    with pytest.raises(NoCapacity, match="No card of machine .* has 25% of its compute"):
        rental_create(team=teams[4], request=slice_order(machine, 25, 100))
    assert written() == before

    # Memory over the card is refused by name whatever compute is free (400, not 409).
    other = sharing_machine(sim_host, TeamFactory(), gpus=1)
    with pytest.raises(ValidationError) as refused:
        rental_create(team=teams[5], request=slice_order(other, 10, CARD_MB + 1))
    assert "memory_mb" in str(refused.value.message_dict["gpu_share"])
    # Memory taken by another slice refuses this one though compute is free (409).
    rental_create(team=teams[5], request=slice_order(other, 10, 20000))
    with pytest.raises(NoCapacity):
        rental_create(team=teams[5], request=slice_order(other, 10, 8000))
    assert GpuSlice.objects.filter(gpu__machine=other).count() == 1


@pytest.mark.django_db
def test_a_card_is_rented_whole_or_sliced_never_both(sim_host, provider_team):
    machine = sharing_machine(sim_host, provider_team, gpus=2)
    renter = funded_teams(1)[0]
    first = rental_create(team=renter, request=slice_order(machine, 50, 1000)).rental
    sliced = first.instance.gpu_slices.get().gpu
    # The other card is whole-rentable; two whole GPUs are not there any more.
    with pytest.raises(NoCapacity, match="Only 1 GPU"):
        rental_create(team=renter, request=whole_order(machine, 2))
    whole = rental_create(team=renter, request=whole_order(machine, 1)).rental
    whole_gpu = whole.instance.gpu_allocations.get().gpu
    assert whole_gpu != sliced
    # A slice never lands on the whole-rented card: the sliced card takes it, or nothing.
    second = rental_create(team=renter, request=slice_order(machine, 50, 1000)).rental
    assert second.instance.gpu_slices.get().gpu == sliced
    with pytest.raises(NoCapacity):
        rental_create(team=renter, request=slice_order(machine, 10, 1000))

    # The database refuses the same, whoever writes: a whole allocation of a sliced card, a
    # slice of a whole-rented card, a slice past 100 %.
    instance = Instance.objects.create(
        team=renter, machine=machine, gpu_count=1, image="gpumkt/busybox:latest"
    )
    for row in (
        lambda: GpuAllocation.objects.create(instance=instance, gpu=sliced),
        lambda: GpuSlice.objects.create(
            instance=instance, gpu=whole_gpu, core_percent=1, memory_mb=1
        ),
        lambda: GpuSlice.objects.create(instance=instance, gpu=sliced, core_percent=1, memory_mb=1),
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            row()


def whole_order(machine, gpus: int) -> RentalRequest:
    return RentalRequest(
        machine_id=machine.pk, gpu_count=gpus, image="gpumkt/busybox:latest", hours=1, disk_gb=1
    )


@pytest.mark.django_db
def test_slice_terms_are_refused_by_name(sim_host, provider_team):
    plain = machine_for(sim_host, TeamFactory())
    sharing = sharing_machine(sim_host, provider_team, gpus=1, sharing_min_core_percent=20)
    renter = funded_teams(1)[0]
    cases = [
        (plain, slice_order(plain, 25, 100), "gpu_share", "does not share"),
        (sharing, slice_order(sharing, 10, 100), "gpu_share", "from 20 to 100 percent"),
        (sharing, slice_order(sharing, 25, 100, card_policy="fullest"), "card_policy", "binpack"),
    ]
    for _machine, order, field, words in cases:
        with pytest.raises(ValidationError) as refused:
            rental_create(team=renter, request=order)
        assert words in str(refused.value.message_dict[field])
    assert written() == (0, 0, 0, 0)


@pytest.mark.django_db
def test_card_policy_binpack_fills_the_fullest_card_spread_the_emptiest(sim_host, provider_team):
    machine = sharing_machine(sim_host, provider_team, gpus=3)
    renter = funded_teams(1)[0]
    first = rental_create(team=renter, request=slice_order(machine, 40, 1000)).rental
    card = first.instance.gpu_slices.get().gpu_id
    packed = rental_create(team=renter, request=slice_order(machine, 40, 1000)).rental
    assert packed.instance.gpu_slices.get().gpu_id == card
    spread = rental_create(
        team=renter, request=slice_order(machine, 10, 1000, card_policy=SPREAD)
    ).rental
    assert spread.instance.gpu_slices.get().gpu_id != card
    # Binpack kept one card whole for whole renters; the offer says so.
    offer = Offer.objects.get(machine=machine, all_free=True)
    assert offer.num_gpus == 1
    assert offer.slice_core_percent == 100 and offer.gpu_frac == 1.0


@pytest.mark.django_db
def test_console_provider_shares_the_machine_and_a_renter_rents_a_slice_from_the_offers_page(
    client, sim_host, provider_team, team, owner, django_capture_on_commit_callbacks
):
    import html
    import re

    from tests.conftest import client_for

    machine = machine_for(sim_host, provider_team, mps_available=True)
    Gpu.objects.filter(machine=machine, index__gte=1).delete()
    provider = client_for(client, provider_team.memberships.get().user, provider_team)
    page = provider.get(f"/machines/{machine.pk}/").content.decode()
    assert 'id="sharing-form"' in page and "Sharing off" in page
    bad = provider.post(
        f"/machines/{machine.pk}/sharing/", {"enabled": "on", "min_core_percent": "0"}, follow=True
    )
    assert "min_core_percent" in html.unescape(bad.content.decode())
    machine.refresh_from_db()
    assert not machine.sharing_enabled
    with django_capture_on_commit_callbacks(execute=True):  # the offer, the MPS daemon
        done = provider.post(
            f"/machines/{machine.pk}/sharing/",
            {"enabled": "on", "min_core_percent": "20"},
            follow=True,
        )
    assert "GPU sharing on" in html.unescape(done.content.decode())
    machine.refresh_from_db()
    assert machine.sharing_enabled and machine.sharing_min_core_percent == 20

    fund(team)
    from django.test import Client

    renter = client_for(Client(), owner, team)
    offers = renter.get("/offers/").content.decode()
    assert "slice ≤ 100% · 24564 MB" in html.unescape(offers)
    assert re.search(rf'data-machine="{machine.pk}"[^>]*data-sharing="1"', offers)
    form = {
        "rent_kind": "slice", "core_percent": "10", "memory_mb": "8192", "card_policy": "spread",
        "duration_hours": "1", "disk_gb": "1", "image": "gpumkt/busybox:latest",
    }  # fmt: skip
    refused = renter.post(f"/offers/{machine.pk}/rent/", form, follow=True)
    assert "from 20 to 100 percent" in html.unescape(refused.content.decode())
    assert not Instance.objects.filter(team=team).exists()
    rented = renter.post(f"/offers/{machine.pk}/rent/", {**form, "core_percent": "30"})
    instance = Instance.objects.get(team=team)
    assert rented.status_code == 302 and rented.url == f"/instances/{instance.pk}/"
    assert (instance.slice_core_percent, instance.slice_memory_mb) == (30, 8192)
    # The provider sees how full the card is.
    page = html.unescape(provider.get(f"/machines/{machine.pk}/").content.decode())
    assert 'id="card-slices"' in page and "8192 / 24564 MB" in page


@pytest.mark.django_db
def test_a_stopped_slice_does_not_come_back_once_the_machine_stopped_sharing(
    sim_host, provider_team
):
    from hosts.models import Machine
    from scheduler.services import gpu_allocation_reclaim, gpu_allocation_release

    machine = sharing_machine(sim_host, provider_team, gpus=1)
    rental = rental_create(team=funded_teams(1)[0], request=slice_order(machine, 50, 1000)).rental
    instance = rental.instance
    gpu_allocation_release(instance=instance)  # as a stop does once the host confirms
    Machine.objects.filter(pk=machine.pk).update(sharing_enabled=False)
    with pytest.raises(NoCapacity, match="no longer shares"):
        gpu_allocation_reclaim(instance=instance)
    assert not GpuSlice.objects.filter(instance=instance, released_at=None).exists()
    # The card is whole-rentable again.
    rental_create(team=funded_teams(1)[0], request=whole_order(machine, 1))
