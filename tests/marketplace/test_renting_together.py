"""Rents that reach a web process together are placed in one transaction (group commit), each
with its own terms, hold and launch, as if it had come alone."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from billing.models import Hold
from hosts.models import Machine
from marketplace.models import Rental, Role
from marketplace.rentals.renting import _renting_together
from scheduler.models import GpuAllocation
from tests.billing.ledger_checks import holds_and_balance
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund, machine_for, until
from tests.observability.conftest import METRICS_TOKEN, Scraped
from tests.observability.test_logs import QUICK_STOP, ConsoleCapture

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def renter(name: str, dollars: int):
    team = TeamFactory(name=name)
    add_member(team, UserFactory(username=name), Role.OWNER)
    if dollars:
        fund(team, dollars)
    return team, key_client(team)


def rent(client, machine):
    return client.post(
        "/api/v1/instances/",
        {
            "machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
            "duration_hours": 1, "entrypoint": "sh", "args": QUICK_STOP, "ports": [],
        },
        format="json",
    )  # fmt: skip


def batches(client) -> tuple[float, float]:
    """(batches, orders) placed so far by rent batches, as /metrics shows them."""
    scraped = Scraped(
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}").content.decode()
    )
    return (
        scraped.value("gpumkt_rent_batch_orders_count") or 0.0,
        scraped.value("gpumkt_rent_batch_orders_sum") or 0.0,
    )


def blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def test_renters_arriving_together_share_a_transaction_and_keep_their_own_terms(
    sim_host_factory, provider_team, client, settings
):
    """Four renters, one of them without credit. The machine's row is held by another
    transaction, so the first rent waits on it and the other three queue behind it: they are
    placed together once it ends. Each paying renter gets its own GPU, hold and launch (logged
    under its own request); the one without credit is refused alone, and nothing is written
    for it."""
    settings.METRICS_TOKEN = METRICS_TOKEN
    machine = machine_for(sim_host_factory(gpus=4), provider_team)
    renters = [renter("early", 100), renter("second", 100), renter("third", 100)]
    broke_team, broke_client = renter("broke", 0)
    before = batches(client)

    release = threading.Event()

    def hold_the_machine():
        with transaction.atomic():
            Machine.objects.select_for_update().get(pk=machine.pk)
            held.set()
            release.wait(30)
        connection.close()

    held = threading.Event()
    statuses: dict[str, tuple[int, dict]] = {}

    def rent_as(name, client):
        try:
            response = rent(client, machine)
            statuses[name] = (response.status_code, response.json())
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_machine)
    holder.start()
    held.wait(10)
    with ConsoleCapture() as capture:
        threads = [threading.Thread(target=rent_as, args=("early", renters[0][1]))]
        threads[0].start()
        until(blocked_on_a_lock)
        for name, client_ in [("second", renters[1][1]), ("third", renters[2][1])]:
            threads.append(threading.Thread(target=rent_as, args=(name, client_)))
        threads.append(threading.Thread(target=rent_as, args=("broke", broke_client)))
        for thread in threads[1:]:
            thread.start()
        until(lambda: _renting_together.waiting == 3)
        release.set()
        for thread in [holder, *threads]:
            thread.join(timeout=60)

    assert {name: status for name, (status, _) in statuses.items()} == {
        "early": 201, "second": 201, "third": 201, "broke": 402,
    }  # fmt: skip
    assert statuses["broke"][1]["error"]["code"] == "insufficient_credit"
    # Two transactions for four orders: the first alone, then the three that queued.
    after = batches(client)
    assert (after[0] - before[0], after[1] - before[1]) == (2, 4)

    for team, _ in renters:
        rental = Rental.objects.get(team=team)
        assert rental.machine_id == machine.pk and rental.gpu_count == 1
        holds, balance = holds_and_balance([rental.hold_id], team.pk)
        hold = holds[rental.hold_id]
        assert hold.team_id == team.pk and hold.amount > 0
        # A metering sweep may already have captured the first seconds of the hold.
        assert balance.held == hold.remaining
    gpus = GpuAllocation.objects.filter(released_at=None, gpu__machine=machine)
    assert gpus.count() == 3 and len({a.gpu_id for a in gpus}) == 3
    assert not Rental.objects.filter(team=broke_team).exists()
    assert not Hold.objects.filter(team_id=broke_team.pk).exists()

    # Each launch ran under the request that rented it, whichever thread placed the batch.
    lines = capture.lines()
    request_of = {
        line["team_id"]: line["request_id"]
        for line in lines
        if line["event"] == "request_finished" and line.get("code") == 201
    }
    runs = [line for line in lines if line.get("command") == "docker run" and "exit_code" in line]
    assert len(runs) == 3
    for run in runs:
        assert run["exit_code"] == 0
        assert run["request_id"] == request_of[run["team_id"]]
