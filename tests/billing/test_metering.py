"""The metering sweep a worker runs (``metering_sweep``): real rentals with their clocks, their
holds, one combined capture per hold, and nothing twice."""

from __future__ import annotations

from datetime import timedelta

import pytest

from billing.holds import hold_release
from billing.models import Hold, Transfer, TransferKind
from marketplace.models import Rental
from marketplace.services.metering import metering_sweep, rental_meter, rental_owed
from tests.billing.ledger_checks import assert_ledger_consistent, ledger_counts

pytestmark = pytest.mark.django_db

# The ``rent`` fixture's terms: $0.60 per GPU-hour, $0.15 per GB-month of storage (a month is
# 30 days = 2,592,000 s), 20 GB of disk. Every amount below is worked out by hand from them, in
# micro-dollars (µ$), each charge rounded once, half up, from its clock's seconds.


def test_sweep_captures_what_each_rental_owes_in_one_capture_per_hold(rent):
    now = rent.now
    running = rent(gpus=2, gpu_clock_since=now - timedelta(minutes=90),
                   storage_clock_since=now - timedelta(minutes=90))  # fmt: skip
    stopped = rent(gpu_seconds=1800, storage_clock_since=now - timedelta(hours=2))
    # Its end has passed: both clocks stop at ends_at, not at the sweep's time.
    ended = rent(ends_in=-timedelta(minutes=10), gpu_clock_since=now - timedelta(hours=1),
                 storage_clock_since=now - timedelta(hours=1))  # fmt: skip

    captured = metering_sweep(now=now)

    expected = {  # (GPU, storage) in µ$
        # 600,000 µ$/GPU-h × 2 GPUs × 5,400 s / 3,600 = 1,800,000;
        # 150,000 µ$/GB-month × 20 GB × 5,400 s / 2,592,000 = 6,250
        running.pk: (1_800_000, 6_250),
        # GPU: only the 1,800 banked seconds: 600,000 × 1,800 / 3,600 = 300,000;
        # storage 2 h: 3,000,000 × 7,200 / 2,592,000 = 8,333.3 → 8,333
        stopped.pk: (300_000, 8_333),
        # Both clocks ran 1 h but stop at ends_at, 10 min ago: 3,000 s.
        # 600,000 × 3,000 / 3,600 = 500,000; 3,000,000 × 3,000 / 2,592,000 = 3,472.2 → 3,472
        ended.pk: (500_000, 3_472),
    }
    assert captured == 2_618_055  # the sum of the six amounts above
    for rental in (running, stopped, ended):
        hold = Hold.objects.get(pk=rental.hold_id)
        assert (hold.captured_gpu, hold.captured_storage) == expected[rental.pk]
        (capture,) = Transfer.objects.filter(hold=hold, kind=TransferKind.CAPTURE)
        assert capture.usage_kind == "gpu+storage"
        assert (capture.amount - capture.storage_amount, capture.storage_amount) == expected[
            rental.pk
        ]
    assert_ledger_consistent()


def test_a_second_sweep_at_the_same_time_captures_nothing_and_a_later_one_the_difference(rent):
    now = rent.now
    rental = rent(gpu_clock_since=now - timedelta(hours=1),
                    storage_clock_since=now - timedelta(hours=1))  # fmt: skip
    # 1 h: 600,000 µ$ of GPU; storage 3,000,000 × 3,600 / 2,592,000 = 4,166.7 → 4,167
    assert metering_sweep(now=now) == 604_167
    before = ledger_counts()
    assert metering_sweep(now=now) == 0
    assert rental_meter(rental=rental, now=now) == 0  # the per-rental path agrees
    assert ledger_counts() == before

    # A minute later, 3,660 s in all: GPU 600,000 × 3,660 / 3,600 = 610,000; storage
    # 3,000,000 × 3,660 / 2,592,000 = 4,236.1 → 4,236. Total 614,236, of which 604,167 was
    # captured already.
    assert metering_sweep(now=now + timedelta(minutes=1)) == 10_069
    hold = Hold.objects.get(pk=rental.hold_id)
    assert (hold.captured_gpu, hold.captured_storage) == (610_000, 4_236)
    assert Transfer.objects.filter(hold=hold, kind=TransferKind.CAPTURE).count() == 2
    assert_ledger_consistent()


def test_the_sweep_skips_settled_rentals_and_closed_holds(rent):
    now = rent.now
    settled = rent(storage_clock_since=now - timedelta(hours=1), settled_at=now)
    released = rent(storage_clock_since=now - timedelta(hours=1))
    hold_release(hold_id=released.hold_id)
    hold_release(hold_id=settled.hold_id)
    before = ledger_counts()
    assert metering_sweep(now=now) == 0
    assert ledger_counts() == before


def test_the_sweep_goes_through_every_batch(rent):
    now = rent.now
    rentals = [
        rent(gpu_clock_since=now - timedelta(minutes=n + 1), storage_clock_since=now)
        for n in range(5)
    ]
    captured = metering_sweep(now=now, batch_size=2)
    # GPU clocks of 1..5 minutes at 600,000 µ$/h are 10,000 µ$ a minute: 10,000 × (1+2+3+4+5);
    # storage clocks start now, so no storage yet.
    assert captured == 150_000
    assert sorted(Hold.objects.get(pk=c.hold_id).captured_gpu for c in rentals) == [
        10_000, 20_000, 30_000, 40_000, 50_000,
    ]  # fmt: skip
    assert Transfer.objects.filter(kind=TransferKind.CAPTURE).count() == 5


def test_the_sweep_charges_exactly_what_rental_owed_says(rent):
    """The sweep computes what each rental owes in the database on PostgreSQL (and through
    ``rental_owed`` on SQLite): the same integers, banked amounts included, halves rounded up,
    part-seconds dropped, both clocks stopped at the end."""
    now = rent.now
    rentals = {
        # $0.0018 an hour for 1 s is 0.5 µ$ → 1; 10 GB at $0.1296 a GB-month for 1 s is 0.5 → 1.
        "halves": rent(disk=10, gpu_clock_since=now - timedelta(seconds=1),
                       storage_clock_since=now - timedelta(seconds=1)),
        # Owed at earlier prices and GPU-seconds banked at an earlier count add to the clocks.
        "banked": rent(gpus=2, gpu_owed_banked=123_457, storage_owed_banked=777,
                       gpu_unit_seconds=4_321, gpu_seconds=60,
                       gpu_clock_since=now - timedelta(seconds=90, microseconds=999_999),
                       storage_seconds=30, storage_clock_since=now - timedelta(minutes=7)),
        # A clock set after the reading time counts nothing (not a negative amount).
        "ahead": rent(gpu_clock_since=now + timedelta(minutes=5), storage_seconds=100,
                      storage_clock_since=now + timedelta(minutes=5)),
        "ended": rent(ends_in=-timedelta(minutes=1), gpu_owed_banked=5,
                      gpu_clock_since=now - timedelta(minutes=30, milliseconds=500),
                      storage_clock_since=now - timedelta(minutes=30)),
    }  # fmt: skip
    Rental.objects.filter(pk=rentals["halves"].pk).update(
        price_per_gpu_hour=1_800, storage_price_per_gb_month=129_600
    )
    expected = {}
    for name, rental in rentals.items():
        rental.refresh_from_db()
        owed = rental_owed(rental, now)
        expected[name] = (owed.gpu, owed.storage)
    assert expected["halves"] == (1, 1)
    # 600,000 × (4,321 + 2 × (60 + 90)) = 600,000 × 4,621 / 3,600 = 770,166.7 → 770,167, plus
    # 123,457 banked; storage 3,000,000 × (30 + 420) / 2,592,000 = 520.8 → 521, plus 777.
    assert expected["banked"] == (893_624, 1_298)
    assert expected["ahead"] == (0, 116)  # 3,000,000 × 100 / 2,592,000 = 115.7 → 116

    assert metering_sweep(now=now) == sum(gpu + storage for gpu, storage in expected.values())
    for name, rental in rentals.items():
        hold = Hold.objects.get(pk=rental.hold_id)
        assert (hold.captured_gpu, hold.captured_storage) == expected[name], name
    assert_ledger_consistent()


def test_a_sweep_with_nothing_new_to_capture_writes_nothing_and_leaves_holds_alone(rent):
    """A hold whose rental owes nothing beyond what was captured gets no capture, no entry
    and no change; the others in its batch are captured as usual."""
    now = rent.now
    idle = rent(storage_clock_since=now - timedelta(hours=1))
    busy = rent(gpu_clock_since=now - timedelta(hours=1))
    assert metering_sweep(now=now) == 600_000 + 4_167
    idle_hold = Hold.objects.get(pk=idle.hold_id)
    # The idle rental's storage clock stopped at the first sweep's time (it was destroyed).
    Rental.objects.filter(pk=idle.pk).update(storage_seconds=3_600, storage_clock_since=None)
    before = Transfer.objects.filter(hold_id=idle.hold_id).count()

    # A minute later only the busy rental owes more: 10,000 µ$ of GPU time.
    assert metering_sweep(now=now + timedelta(minutes=1)) == 10_000
    assert Transfer.objects.filter(hold_id=idle.hold_id).count() == before
    assert Hold.objects.get(pk=idle.hold_id).captured_storage == idle_hold.captured_storage
    assert Hold.objects.get(pk=busy.hold_id).captured_gpu == 610_000
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("connections", [1, 2, 3])
def test_a_sweep_outside_a_transaction_settles_its_batches_on_its_connections(
    rent, settings, connections
):
    """As the worker runs it (no transaction around it), on one or more connections: on
    PostgreSQL the batches are settled on all of them at once; every rental is captured once,
    the books balance."""
    settings.METERING_SWEEP_CONNECTIONS = connections
    now = rent.now
    rentals = [
        rent(gpu_clock_since=now - timedelta(minutes=n + 1), storage_clock_since=now)
        for n in range(7)
    ]
    assert metering_sweep(now=now, batch_size=2) == 10_000 * sum(range(1, 8))
    assert metering_sweep(now=now, batch_size=2) == 0
    assert sorted(Hold.objects.get(pk=r.hold_id).captured_gpu for r in rentals) == [
        10_000 * n for n in range(1, 8)
    ]
    assert Transfer.objects.filter(kind=TransferKind.CAPTURE).count() == 7
    assert_ledger_consistent()
