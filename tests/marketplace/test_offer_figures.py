"""Offers' measured figures: searchable and sortable by the fields vast users filter on, in
/api/v1/ and through /api/v0/, and readable before renting (public for listed machines)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from hosts.models import BenchmarkRun, Machine
from marketplace.services.offers import offer_refresh
from tests.conftest import client_for, key_client
from tests.marketplace.test_offer_search import offer_on

pytestmark = pytest.mark.django_db


def benchmarked(offer, *, dlperf: float, tflops: float, inet_down: float, simulated: bool = True):
    """A machine whose last passing benchmark measured these figures (per GPU)."""
    Machine.objects.filter(pk=offer.machine_id).update(
        verified=True, bench_at=timezone.now(), bench_gpu_simulated=simulated, compute_cap=890,
        tflops_per_gpu=tflops, gpu_mem_bw=1008.0, dlperf_per_gpu=dlperf, inet_up=900.0,
        inet_down=inet_down, disk_read_mbps=1500.0, disk_write_mbps=800.0,
        verification_detail="self-test and benchmark passed",
    )  # fmt: skip
    return offer_refresh(machine_id=offer.machine_id)


@pytest.fixture
def market(provider):
    return {
        "fast": benchmarked(
            offer_on(provider, "fast", gpus=2, price=1.0), dlperf=140, tflops=82.6, inet_down=900
        ),
        "slow": benchmarked(
            offer_on(provider, "slow", gpus=1, price=0.2), dlperf=40, tflops=35.6, inet_down=100
        ),
        "never": offer_on(provider, "never", gpus=1, price=0.3),
    }


@pytest.fixture
def provider(db):
    from marketplace.models import Role
    from tests.factories import TeamFactory, UserFactory, add_member

    team = TeamFactory(name="Provider")
    add_member(team, UserFactory(username="provider"), Role.OWNER)
    return team


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    by_id = dict(Machine.objects.values_list("pk", "name"))
    return [by_id[offer["machine_id"]] for offer in response.json()["offers"]]


def test_an_offers_figures_are_per_gpu_times_its_gpus_and_per_its_price(market):
    fast = market["fast"]
    assert (fast.dlperf, fast.total_flops, fast.compute_cap) == (280.0, 165.2, 890)
    assert fast.dlperf_per_dphtotal == 140.0  # 280 for $2.00 an hour
    assert market["never"].dlperf == 0 and market["never"].verified is False


def test_the_fields_filter_and_sort_in_the_api(team, owner, market):
    api = key_client(team)
    # Single-GPU bundles: "fast" gives 140 a GPU (its 2-GPU bundle 280).
    assert names(api.get("/api/v1/offers/", {"q": "dlperf>100 num_gpus=1"})) == ["fast"]
    by_value = {"q": "verified=true num_gpus=1 -o dlperf_per_dphtotal-"}
    assert names(api.get("/api/v1/offers/", by_value)) == [
        "slow",  # 40 for $0.20: 200 per dollar-hour
        "fast",  # 140 for $1.00
    ]
    found = api.get("/api/v1/offers/", {"q": "inet_down>=500 compute_cap>=890 total_flops>100"})
    assert names(found) == ["fast"]
    offer = found.json()["offers"][0]
    assert offer["dlperf"] == 280.0 and offer["inet_down"] == 900.0
    assert offer["bench_simulated"] is True
    bad = api.get("/api/v1/offers/", {"q": "dlperf>fast"})
    assert bad.status_code == 400 and "dlperf needs a number" in bad.content.decode()


def test_the_vast_cli_body_filters_and_sorts_by_them(team, owner, market):
    api = key_client(team)
    body = {
        "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
        "dlperf": {"gte": 30}, "inet_down": {"gt": 50}, "num_gpus": {"eq": 1},
        "order": [["dlperf_per_dphtotal", "desc"]], "type": "on-demand",
    }  # fmt: skip
    offers = api.post("/api/v0/bundles/", body, format="json").json()["offers"]
    assert [o["machine_id"] for o in offers] == [
        market["slow"].machine_id,
        market["fast"].machine_id,
    ]
    assert offers[1]["dlperf"] == 140.0 and offers[1]["total_flops"] == 82.6  # one GPU's


def test_an_offers_figures_are_public_for_listed_machines_only(
    client, team, owner, market, provider
):
    run = BenchmarkRun.objects.create(
        machine_id=market["fast"].machine_id, measured_at=timezone.now(), passed=True,
        gpu_simulated=True, gpu_count=2, tflops_per_gpu=82.6, dlperf_per_gpu=140,
        steps=[{"name": "gpu", "ok": True, "detail": "simulated"}],
    )  # fmt: skip
    api = key_client(team)  # another team than the provider's: the market is public
    figures = api.get(f"/api/v1/offers/{market['fast'].machine_id}/figures/").json()
    assert figures["verified"] is True
    assert figures["benchmarks"][0]["measured_at"] == run.measured_at.isoformat()
    assert figures["benchmarks"][0]["gpu_simulated"] is True
    unlisted = offer_on(provider, "unlisted", listed=False)
    assert api.get(f"/api/v1/offers/{unlisted.machine_id}/figures/").status_code == 404
    client_for(client, owner, team)
    page = client.get(f"/offers/{market['fast'].machine_id}/figures/").content.decode()
    assert "GPU figures simulated" in page and "self-test and benchmark passed" in page
    assert client.get(f"/offers/{unlisted.machine_id}/figures/").status_code == 404
    offers_page = client.get("/offers/").content.decode()
    assert f'href="/offers/{market["fast"].machine_id}/figures/"' in offers_page
