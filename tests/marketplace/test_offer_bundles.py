"""Offers as GPU-count bundles (issue 32): which bundles a machine is offered in, what each
costs, when an offer ends (its machine's end date or next maintenance), the fields vast users
filter on, and the console's GPU-count and price filters on the bundle a renter would get."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from hosts.models import Machine, MaintenanceWindow
from hosts.services import maintenance_window_add
from marketplace.models import Offer, Role
from marketplace.services.offers import bundle_sizes, offer_refresh
from tests.conftest import client_for, key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.test_offer_search import offer_on

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider(db):
    team = TeamFactory(name="Provider")
    add_member(team, UserFactory(username="provider"), Role.OWNER)
    return team


@pytest.mark.parametrize(
    ("total", "free", "min_gpus", "sizes"),
    [
        (8, 8, 1, [1, 2, 4, 8]),
        (8, 5, 1, [1, 2, 4, 5, 8]),  # the free count is a bundle of its own
        (8, 8, 3, [3, 4, 8]),  # from the provider's minimum, which is a size itself
        (6, 6, 1, [1, 2, 4, 6]),  # the whole machine, though not a power of two
        (4, 0, 1, [0, 1, 2, 4]),  # none free: the all-free row has none, nothing fits
        (2, 1, 2, [1, 2]),  # fewer free than the minimum: listed, not rentable
        (0, 0, 1, [0]),
    ],
)
def test_bundle_sizes(total, free, min_gpus, sizes):
    assert bundle_sizes(total=total, free=free, min_gpus=min_gpus) == sizes


def test_an_eight_gpu_machine_is_offered_as_1_2_4_and_8_each_priced_for_its_gpus(provider):
    whole = offer_on(provider, "eight", gpus=8, price=0.6)
    offers = {o.num_gpus: o for o in Offer.objects.filter(machine_id=whole.machine_id)}
    assert sorted(offers) == [1, 2, 4, 8]
    assert len({o.pk for o in offers.values()}) == 4  # each its own id
    assert {n: o.dph_total for n, o in offers.items()} == {
        1: 600_000, 2: 1_200_000, 4: 2_400_000, 8: 4_800_000,
    }  # fmt: skip
    assert all(o.rentable and o.price_per_gpu_hour == 600_000 for o in offers.values())
    assert [n for n, o in offers.items() if o.all_free] == [8]
    # Refreshing again keeps every bundle's id (a renter's search stays valid).
    offer_refresh(machine_id=whole.machine_id)
    again = {o.num_gpus: o.pk for o in Offer.objects.filter(machine_id=whole.machine_id)}
    assert again == {n: o.pk for n, o in offers.items()}


def test_the_providers_minimum_is_respected(provider):
    whole = offer_on(provider, "min3", gpus=8, price=0.5)
    Machine.objects.filter(pk=whole.machine_id).update(min_gpus=3)
    offer_refresh(machine_id=whole.machine_id)
    sizes = Offer.objects.filter(machine_id=whole.machine_id).values_list("num_gpus", flat=True)
    assert sorted(sizes) == [3, 4, 8]  # the 1- and 2-GPU bundles are gone


@pytest.fixture
def api(team, owner):
    return key_client(team)


def found(api, q: str) -> list[tuple[str, int]]:
    response = api.get("/api/v1/offers/", {"q": q})
    assert response.status_code == 200, response.content
    names = dict(Machine.objects.values_list("pk", "name"))
    return [(names[o["machine_id"]], o["num_gpus"]) for o in response.json()["offers"]]


def test_price_filters_and_sorts_see_the_bundle_a_renter_gets(api, provider):
    offer_on(provider, "cheap", gpus=4, price=0.23)
    offer_on(provider, "dear", gpus=2, price=0.42)
    offer_on(provider, "dearer", gpus=1, price=0.5)
    assert found(api, "num_gpus=1 dph_total<=0.45 -o dph_total") == [("cheap", 1), ("dear", 1)]
    assert found(api, "dph_total<=0.5 -o dph_total") == [
        ("cheap", 1), ("dear", 1), ("cheap", 2), ("dearer", 1),
    ]  # fmt: skip
    # Per GPU, every bundle of a machine costs the same.
    assert found(api, "dph_per_gpu<0.3 -o num_gpus-") == [("cheap", 4), ("cheap", 2), ("cheap", 1)]
    assert [n for n, _ in found(api, "num_gpus=1 -o dph_per_gpu-")] == ["dearer", "dear", "cheap"]


def test_the_fields_vast_users_filter_on(api, provider, team):
    by_ip = offer_on(provider, "by-ip", gpus=1, price=0.3)
    by_name = offer_on(provider, "by-name", gpus=2, price=0.3)
    Machine.objects.filter(pk=by_name.machine_id).update(
        address="gpu.example.com", cpu_cores=64, port_range_start=30000, port_range_end=30009
    )
    by_name = offer_refresh(machine_id=by_name.machine_id)
    assert by_ip.static_ip and not by_name.static_ip
    assert found(api, "static_ip=false -o num_gpus") == [("by-name", 1), ("by-name", 2)]
    assert found(api, "cpu_cores>=64 num_gpus=2") == [("by-name", 2)]
    assert found(api, "direct_port_count<100") == [("by-name", 1), ("by-name", 2)]
    assert found(api, f"id={by_name.pk}") == [("by-name", 2)]
    assert len(found(api, f"host_id={provider.pk}")) == 3
    assert found(api, f"host_id={team.pk}") == []
    assert found(api, "datacenter=true") == []  # no provider is certified as one yet
    assert [n for n, _ in found(api, "-o cpu_cores-,id")] == ["by-name", "by-name", "by-ip"]
    row = api.get("/api/v1/offers/", {"q": f"id={by_name.pk}"}).json()["offers"][0]
    assert row["id"] == by_name.pk and row["host_id"] == provider.pk
    assert (row["cpu_cores"], row["direct_port_count"], row["static_ip"]) == (64, 10, False)


def test_an_offer_ends_at_the_next_maintenance_window_if_before_the_end_date(
    api, provider, django_capture_on_commit_callbacks
):
    offer = offer_on(provider, "maint", gpus=1, price=0.3, end_in_days=34)
    start = timezone.now() + timedelta(days=2)
    with django_capture_on_commit_callbacks(execute=True):
        maintenance_window_add(
            machine_id=offer.machine_id, starts_at=start, ends_at=start + timedelta(hours=4)
        )
    offer.refresh_from_db()  # the window's announcement refreshed the machine's offers
    assert offer.end_date == start and offer.rentable
    row = api.get("/api/v1/offers/", {"q": "machine_id=" + str(offer.machine_id)}).json()
    assert 1.99 <= row["offers"][0]["duration"] <= 2.0
    assert found(api, "duration>=3") == []
    assert found(api, "duration>=1") == [("maint", 1)]


def test_an_offer_in_a_maintenance_window_now_is_not_rentable(api, provider):
    offer = offer_on(provider, "down", gpus=2, price=0.3)
    now = timezone.now()
    MaintenanceWindow.objects.create(
        machine_id=offer.machine_id,
        starts_at=now - timedelta(hours=1),
        ends_at=now + timedelta(hours=1),
    )
    offer_refresh(machine_id=offer.machine_id)
    assert not Offer.objects.filter(machine_id=offer.machine_id, rentable=True).exists()
    # A window that is over no longer counts.
    MaintenanceWindow.objects.filter(machine_id=offer.machine_id).update(
        starts_at=now - timedelta(hours=3), ends_at=now - timedelta(hours=2)
    )
    offer_refresh(machine_id=offer.machine_id)
    assert Offer.objects.filter(machine_id=offer.machine_id, rentable=True).count() == 2
    assert Offer.objects.get(machine_id=offer.machine_id, all_free=True).end_date is None


# --- the console ---------------------------------------------------------------------------


@pytest.fixture
def console(client, owner, team):
    return client_for(client, owner, team)


def cards(response) -> list[tuple[int, str]]:
    """Each offer card's machine and price per hour, in order."""
    page = response.content.decode()
    machines = [int(m) for m in re.findall(r'<tr data-machine="(\d+)"', page)]
    prices = re.findall(r'<strong class="offer-price">([^<]+)</strong>', page)
    return list(zip(machines, prices, strict=True))


def test_console_one_gpu_under_a_max_price_shows_single_gpu_bundles(console, provider):
    """Issue 32: "1 GPU" and "Max $/hour 0.45" show the $0.23 and $0.42 cards, priced for
    one GPU (a machine's whole price was compared before, and nothing matched)."""
    cheap = offer_on(provider, "cheap", gpus=4, price=0.23)
    dear = offer_on(provider, "dear", gpus=2, price=0.42)
    offer_on(provider, "dearer", gpus=1, price=0.5)
    response = console.get("/offers/", {"gpus": "1", "max_price": "0.45", "sort": "dph_total"})
    assert response.status_code == 200
    assert cards(response) == [(cheap.machine_id, "$0.23"), (dear.machine_id, "$0.42")]
    page = response.content.decode()
    assert '<option value="1" selected>1 GPU</option>' in page
    # Without the GPU count, the 2-GPU bundle of the cheap machine ($0.46) is over the price.
    wider = console.get("/offers/", {"max_price": "0.45", "sort": "dph_total"})
    assert cards(wider) == [(cheap.machine_id, "$0.23"), (dear.machine_id, "$0.42")]
    cheaper = console.get("/offers/", {"max_price": "0.50", "sort": "dph_total"})
    assert [price for _, price in cards(cheaper)] == ["$0.23", "$0.42", "$0.46", "$0.50"]


def test_console_rent_button_rents_the_bundle_on_its_card(console, provider):
    offer_on(provider, "four", gpus=4, price=0.25)
    page = console.get("/offers/", {"gpus": "2"}).content.decode()
    (button,) = re.findall(r'<button type="button" class="primary rent-button"[^>]*>', page)
    assert 'data-gpus="2"' in button and 'data-min="2"' in button and 'data-free="2"' in button
    assert 'data-price="250000"' in button  # per GPU-hour: the dialog multiplies by its GPUs
