"""The metering sweep a worker runs (``metering_sweep``): real contracts with their clocks, their
holds, one combined capture per hold, and nothing twice."""

from __future__ import annotations

from datetime import timedelta

import pytest

from billing import services
from billing.models import Hold, Transfer, TransferKind
from marketplace.models import Contract
from marketplace.services.rentals import contract_meter, contract_owed, metering_sweep
from tests.billing.ledger_checks import assert_ledger_consistent, ledger_counts

pytestmark = pytest.mark.django_db

USD = 1_000_000


def owed_by(contract: Contract, at) -> tuple[int, int]:
    contract.refresh_from_db()
    owed = contract_owed(contract, at)
    return owed.gpu, owed.storage


def test_sweep_captures_what_each_contract_owes_in_one_capture_per_hold(rent):
    now = rent.now
    running = rent(gpus=2, gpu_clock_since=now - timedelta(minutes=90),
                   storage_clock_since=now - timedelta(minutes=90))  # fmt: skip
    stopped = rent(gpu_seconds=1800, storage_clock_since=now - timedelta(hours=2))
    # Its end has passed: both clocks stop at ends_at, not at the sweep's time.
    ended = rent(ends_in=-timedelta(minutes=10), gpu_clock_since=now - timedelta(hours=1),
                 storage_clock_since=now - timedelta(hours=1))  # fmt: skip
    contracts = [running, stopped, ended]

    captured = metering_sweep(now=now)

    expected = {c.pk: owed_by(c, now) for c in contracts}
    assert expected[stopped.pk][0] == 1800 * 600_000 // 3600  # banked GPU time only
    assert expected[ended.pk] == owed_by(ended, now - timedelta(minutes=10))
    assert captured == sum(gpu + storage for gpu, storage in expected.values())
    for contract in contracts:
        hold = Hold.objects.get(pk=contract.hold_id)
        assert (hold.captured_gpu, hold.captured_storage) == expected[contract.pk]
        (capture,) = Transfer.objects.filter(hold=hold, kind=TransferKind.CAPTURE)
        assert capture.usage_kind == "gpu+storage"
        assert (capture.amount - capture.storage_amount, capture.storage_amount) == expected[
            contract.pk
        ]
    assert_ledger_consistent()


def test_a_second_sweep_at_the_same_time_captures_nothing_and_a_later_one_the_difference(rent):
    now = rent.now
    contract = rent(gpu_clock_since=now - timedelta(hours=1),
                    storage_clock_since=now - timedelta(hours=1))  # fmt: skip
    first = metering_sweep(now=now)
    before = ledger_counts()
    assert metering_sweep(now=now) == 0
    assert contract_meter(contract=contract, now=now) == 0  # the per-contract path agrees
    assert ledger_counts() == before

    later = now + timedelta(minutes=1)
    more = metering_sweep(now=later)
    gpu, storage = owed_by(contract, later)
    assert first + more == gpu + storage
    hold = Hold.objects.get(pk=contract.hold_id)
    assert (hold.captured_gpu, hold.captured_storage) == (gpu, storage)
    assert Transfer.objects.filter(hold=hold, kind=TransferKind.CAPTURE).count() == 2
    assert_ledger_consistent()


def test_the_sweep_skips_settled_contracts_and_closed_holds(rent):
    now = rent.now
    settled = rent(storage_clock_since=now - timedelta(hours=1), settled_at=now)
    released = rent(storage_clock_since=now - timedelta(hours=1))
    services.hold_release(hold_id=released.hold_id)
    services.hold_release(hold_id=settled.hold_id)
    before = ledger_counts()
    assert metering_sweep(now=now) == 0
    assert ledger_counts() == before


def test_the_sweep_goes_through_every_batch(rent):
    now = rent.now
    contracts = [
        rent(gpu_clock_since=now - timedelta(minutes=n + 1), storage_clock_since=now)
        for n in range(5)
    ]
    captured = metering_sweep(now=now, batch_size=2)
    assert captured == sum(sum(owed_by(c, now)) for c in contracts)
    assert Transfer.objects.filter(kind=TransferKind.CAPTURE).count() == 5
