"""Interruptible rentals (bids) on a simulated host: real SSH, real Docker, real ledger.

An on-demand rental or a higher bid takes an interruptible rental's GPUs; the interrupted one
stops at once (its GPU charge with it, its data kept) and starts again on the same GPUs when it
wins them back.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from billing.models import Hold
from billing.selectors import ledger_problems
from marketplace.models import Offer, Rental, Role
from marketplace.rentals.metering import rental_owed
from scheduler.models import GpuAllocation, Instance, InstanceEvent
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import docker_inspect, fund, machine_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

RENT = {
    "num_gpus": 1,
    "image": "gpumkt/busybox:latest",
    "duration_hours": 2,
    "disk_gb": 5,
    "entrypoint": "sh",
    "args": ["-c", "echo up; exec sleep 600"],
}
FLOOR = 200_000  # $0.20 per GPU-hour: the provider's minimum bid


def renter(name: str):
    team = TeamFactory(name=name)
    add_member(team, UserFactory(username=name.replace(" ", "")), Role.OWNER)
    fund(team)
    return team, key_client(team)


def rent(client, machine, **overrides):
    return client.post(
        "/api/v1/instances/", {**RENT, "machine_id": machine.pk, **overrides}, format="json"
    )


def live_gpu_ids(instance_id: int) -> list[int]:
    return sorted(
        GpuAllocation.objects.filter(instance_id=instance_id, released_at=None).values_list(
            "gpu_id", flat=True
        )
    )


def running(instance: Instance) -> bool:
    return docker_inspect(instance.container_id)["State"]["Running"]


@pytest.fixture
def bid_machine(sim_host_factory, provider_team):
    return machine_for(sim_host_factory(gpus=1), provider_team, min_bid_price_per_gpu_hour=FLOOR)


def test_on_demand_interrupts_a_bid_which_starts_again_on_its_gpu_when_it_is_free(
    bid_machine, provider_team
):
    _, bidder = renter("bidder")
    _, on_demand = renter("on demand")
    offer = bidder.get("/api/v1/offers/", {"q": f"machine_id={bid_machine.pk}"}).json()
    assert offer["offers"][0]["min_bid"] == "0.200000"

    response = rent(bidder, bid_machine, bid_price="0.30")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["interruptible"] is True and body["bid_price"] == "0.300000"
    bid_instance = Instance.objects.get(pk=body["id"])
    bid_instance.refresh_from_db()
    assert bid_instance.state == "running" and running(bid_instance)
    gpu = live_gpu_ids(bid_instance.pk)
    rental = Rental.objects.get(instance=bid_instance)
    assert rental.interruptible and rental.price_per_gpu_hour == 300_000
    # The hold is the bid's: $0.30 × 2 h = 600,000 µ$, plus storage: $0.10/GB-month × 5 GB ×
    # 7,200 s / 2,592,000 s = 1,388.9 → 1,389 µ$.
    assert Hold.objects.get(pk=rental.hold_id).amount == 600_000 + 1_389
    # The GPU is still offered on demand, and to a bid above the running one.
    offer = Offer.objects.get(machine=bid_machine, all_free=True)
    assert offer.num_gpus == 1 and offer.rentable and offer.min_bid == 301_000

    taken = rent(on_demand, bid_machine)
    assert taken.status_code == 201, taken.content
    winner = Instance.objects.get(pk=taken.json()["id"])
    winner.refresh_from_db()
    bid_instance.refresh_from_db()
    rental.refresh_from_db()
    assert winner.state == "running" and running(winner)
    assert live_gpu_ids(winner.pk) == gpu
    assert bid_instance.state == "stopped" and not running(bid_instance)
    assert bid_instance.status_message.startswith("Interrupted: waiting to win its GPUs back")
    assert live_gpu_ids(bid_instance.pk) == []
    assert rental.interrupted_at is not None
    # GPU time stopped at the interruption; storage goes on, as for a stopped rental.
    assert rental.gpu_clock_since is None and rental.storage_clock_since is not None
    shown = bidder.get(f"/api/v1/instances/{bid_instance.pk}/").json()
    assert shown["state"] == "stopped" and shown["interrupted_at"] is not None
    # The renter's own start is refused while the GPU is taken, saying why.
    refused = bidder.post(f"/api/v1/instances/{bid_instance.pk}/start/")
    assert refused.status_code == 409
    assert "rented by someone else" in str(refused.json())

    assert on_demand.delete(f"/api/v1/instances/{winner.pk}/").status_code == 202
    bid_instance.refresh_from_db()
    rental.refresh_from_db()
    assert bid_instance.state == "running" and running(bid_instance)
    assert live_gpu_ids(bid_instance.pk) == gpu
    assert rental.interrupted_at is None and rental.gpu_clock_since is not None
    reasons = list(
        InstanceEvent.objects.filter(instance=bid_instance)
        .order_by("pk")
        .values_list("reason", flat=True)
    )
    assert any(r.startswith("Interrupted: an on-demand rental") for r in reasons)
    assert reasons[-1] == "Won its GPUs back: running again at its bid"
    assert ledger_problems() == []


def test_a_higher_bid_takes_the_gpu_and_a_raised_bid_wins_it_back(bid_machine):
    _, first = renter("first bidder")
    _, second = renter("second bidder")
    low = rent(first, bid_machine, bid_price="0.30")
    assert low.status_code == 201, low.content
    low_id = low.json()["id"]

    # Equal bids do not interrupt: the answer names the bid that would.
    equal = rent(second, bid_machine, bid_price="0.30")
    assert equal.status_code == 409
    assert "$0.301" in str(equal.json())
    assert Instance.objects.filter(machine=bid_machine).count() == 1

    high = rent(second, bid_machine, bid_price="0.50")
    assert high.status_code == 201, high.content
    high_id = high.json()["id"]
    assert Instance.objects.get(pk=low_id).state == "stopped"
    assert Instance.objects.get(pk=high_id).state == "running"
    assert InstanceEvent.objects.filter(
        instance_id=low_id, reason__startswith="Interrupted: a bid of $0.50"
    ).exists()

    hold = Hold.objects.get(pk=Rental.objects.get(instance_id=low_id).hold_id)
    held_before = hold.amount
    raised = first.put(f"/api/v1/instances/{low_id}/bid/", {"bid_price": "0.60"}, format="json")
    assert raised.status_code == 200, raised.content
    assert raised.json()["bid_price"] == "0.600000"
    # The hold grows by the raise for the time left: at most $0.30 × 2 h.
    hold.refresh_from_db()
    assert held_before < hold.amount <= held_before + 600_000
    low_instance = Instance.objects.get(pk=low_id)
    high_instance = Instance.objects.get(pk=high_id)
    assert low_instance.state == "running" and running(low_instance)
    assert high_instance.state == "stopped" and not running(high_instance)
    assert Rental.objects.get(instance_id=high_id).interrupted_at is not None
    assert GpuAllocation.objects.filter(gpu__machine=bid_machine, released_at=None).count() == 1
    assert ledger_problems() == []


def test_bids_are_checked_against_the_machine_and_refused_by_field(
    bid_machine, sim_host_factory, provider_team
):
    team, client = renter("careful bidder")
    no_bids = machine_for(sim_host_factory(gpus=1), provider_team)
    cases = [
        (bid_machine, {"bid_price": "0.10"}, "bid_price", "from $0.20"),
        (bid_machine, {"bid_price": "-1"}, "bid_price", "negative"),
        (bid_machine, {"bid_price": "abc"}, "bid_price", "not an amount"),
        (bid_machine, {"bid_price": "5000"}, "bid_price", "at most"),
        (no_bids, {"bid_price": "1"}, "bid_price", "takes no bids"),
    ]
    for machine, extra, field, words in cases:
        response = rent(client, machine, **extra)
        assert response.status_code == 400, (extra, response.content)
        assert words in str(response.json()), response.json()
        assert field in str(response.json())
    assert not Instance.objects.filter(team=team).exists()
    # An on-demand rental's bid cannot be changed.
    on_demand = rent(client, bid_machine).json()["id"]
    response = client.put(f"/api/v1/instances/{on_demand}/bid/", {"bid_price": "1"}, format="json")
    assert response.status_code == 400 and "on demand" in str(response.json())


def test_a_changed_bid_charges_the_new_bid_from_then_on_only(bid_machine):
    _, client = renter("thrifty bidder")
    instance_id = rent(client, bid_machine, bid_price="0.30").json()["id"]
    rental = Rental.objects.get(instance_id=instance_id)
    # An hour at $0.30 has passed (moved clocks, so the figures are exact).
    an_hour_ago = timezone.now() - timedelta(hours=1)
    Rental.objects.filter(pk=rental.pk).update(gpu_clock_since=an_hour_ago)
    assert (
        client.put(
            f"/api/v1/instances/{instance_id}/bid/", {"bid_price": "0.50"}, format="json"
        ).status_code
        == 200
    )
    rental.refresh_from_db()
    assert 300_000 <= rental.gpu_owed_banked <= 300_000 + 100  # the hour at the old bid
    later = timezone.now() + timedelta(minutes=30)
    owed = rental_owed(rental, later).gpu
    # Then half an hour at $0.50 (and the seconds the test took between the two readings).
    assert 300_000 + 250_000 <= owed <= 300_000 + 250_000 + 1_000


def test_ten_bidders_race_for_one_gpu_and_one_runs(bid_machine):
    clients = [renter(f"racing bidder {n}")[1] for n in range(10)]
    barrier = threading.Barrier(10)
    statuses: list[int] = []
    lock = threading.Lock()

    def race(n: int, client):
        try:
            barrier.wait()
            response = rent(client, bid_machine, bid_price=f"0.{30 + n * 5}", duration_hours=1)
            with lock:
                statuses.append(response.status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(n, c)) for n, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert len(statuses) == 10 and set(statuses) <= {201, 409}, statuses
    assert 201 in statuses
    live = GpuAllocation.objects.filter(gpu__machine=bid_machine, released_at=None)
    assert live.count() == 1
    holder = Instance.objects.get(pk=live.get().instance_id)
    # The GPU ends with the highest bid that got in; every other accepted bid is waiting.
    accepted = Rental.objects.filter(machine=bid_machine)
    assert accepted.count() == statuses.count(201)
    # Each accepted bid's state and history, to read when this fails.
    story = {
        r.price_per_gpu_hour: list(
            InstanceEvent.objects.filter(instance_id=r.instance_id)
            .order_by("pk")
            .values_list("to_state", "reason")
        )
        for r in accepted
    }
    assert holder.rental.price_per_gpu_hour == max(r.price_per_gpu_hour for r in accepted), story
    holder.refresh_from_db()
    assert holder.state == "running" and running(holder)
    for rental in accepted.exclude(instance=holder):
        instance = Instance.objects.get(pk=rental.instance_id)
        assert instance.state == "stopped" and rental.interrupted_at is not None
        assert not instance.container_id or not running(instance)
    assert ledger_problems() == []
