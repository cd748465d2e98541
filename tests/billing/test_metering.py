"""The metering sweep a worker runs (``metering_sweep``): real rentals with their clocks, their
holds, one combined capture per hold, and nothing twice."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from fractions import Fraction

import hypothesis
import pytest
from django.db import transaction
from django.test import override_settings
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from billing.capture import Capture, capture_due
from billing.credits import credit_grant
from billing.holds import hold_extend, hold_release, platform_fee_percent
from billing.models import Hold, HoldStatus, Transfer, TransferKind
from billing.money import usage_owed
from marketplace.models import Rental
from marketplace.rentals.metering import (
    metering_sweep,
    rental_bank_gpu_owed,
    rental_meter,
    rental_owed,
)
from marketplace.services.pricing import extension_quote, storage_owed
from tests.billing.ledger_checks import assert_ledger_consistent, ledger_counts
from tests.conftest import examples

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


def test_capture_due_takes_the_difference_gpu_first_within_the_hold():
    """The rule by hand, 10 % fee: a hold of 1,000 µ$ with 300 of GPU time and 100 of storage
    captured and nothing released holds 600 more."""
    hold = {"amount": 1_000, "captured_gpu": 300, "captured_storage": 100, "released": 0}
    ten = Fraction(10)
    # Owed 450 of GPU time and 130 of storage: 150 and 30 more. The fee on all captured after
    # (580 → 58) minus before (400 → 40) is 18.
    assert capture_due(**hold, owed_gpu=450, owed_storage=130, percent=ten) == (150, 30, 18)
    # Owed 800 and 500: GPU time takes its 500 first, storage the 100 left. 1,000 → 100, less 40.
    assert capture_due(**hold, owed_gpu=800, owed_storage=500, percent=ten) == (500, 100, 60)
    # Owed less than was captured (a total that lags behind) captures nothing, gives nothing back.
    assert capture_due(**hold, owed_gpu=200, owed_storage=100, percent=ten) == (0, 0, 0)
    # Fees round once on the cumulative total: 5 µ$ then 5 more at 10 % are 1 (0.5 → 1), then 0.
    first = capture_due(amount=100, captured_gpu=0, captured_storage=0, released=0,
                        owed_gpu=5, owed_storage=0, percent=ten)  # fmt: skip
    second = capture_due(amount=100, captured_gpu=5, captured_storage=0, released=0,
                         owed_gpu=10, owed_storage=0, percent=ten)  # fmt: skip
    assert (first.fee, second.fee) == (1, 0)


# Fee percentages the property test runs under: the default, none, and ones whose rounding
# differs at every amount.
FEE_PERCENTS = ["10", "0", "12.5", "33.3333", "99.99"]
EVENTS = ["none", "stop", "start", "offline", "online", "extend", "reprice", "end"]
HOUR = 3600


def _draw_rental(data, rent, renter_team, span_seconds: int) -> Rental:
    """A rental of generated terms and clocks, its hold a generated share of what it could owe
    over the example's span (0-130 %: often nearly or wholly used up)."""
    now = rent.now
    gpus = data.draw(st.integers(1, 8), label="gpus")
    disk = data.draw(st.integers(1, 4_000), label="disk GB")
    price = data.draw(st.integers(0, 9_000_000), label="µ$ per GPU-hour")
    storage_price = data.draw(st.integers(0, 500_000), label="µ$ per GB-month")
    clocks = {
        "gpu_seconds": data.draw(st.integers(0, 10**6)),
        "gpu_unit_seconds": data.draw(st.integers(0, 10**6)),
        "gpu_owed_banked": data.draw(st.integers(0, 10**8)),
        "storage_seconds": data.draw(st.integers(0, 10**7)),
        "storage_owed_banked": data.draw(st.integers(0, 10**6)),
    }
    for clock in ("gpu_clock_since", "storage_clock_since"):
        if data.draw(st.booleans(), label=f"{clock} running"):
            ago = data.draw(st.integers(-HOUR, 3 * HOUR), label=f"{clock} seconds ago")
            micro = data.draw(st.integers(0, 999_999), label=f"{clock} microseconds")
            clocks[clock] = now - timedelta(seconds=ago, microseconds=micro)
    # Its end anywhere from before the first sweep to after the last: often between two.
    ends_in = timedelta(
        seconds=data.draw(st.integers(-2 * HOUR, span_seconds + HOUR), label="ends in"),
        microseconds=data.draw(st.integers(0, 999_999), label="ends in, microseconds"),
    )
    could_owe = (
        clocks["gpu_owed_banked"]
        + usage_owed(
            rate_per_hour=price,
            seconds=clocks["gpu_unit_seconds"]
            + gpus * (clocks["gpu_seconds"] + span_seconds + 3 * HOUR),
        )
        + clocks["storage_owed_banked"]
        + storage_owed(
            price_per_gb_month=storage_price,
            disk_gb=disk,
            seconds=clocks["storage_seconds"] + span_seconds + 3 * HOUR,
        )
    )
    share = data.draw(st.integers(0, 130), label="hold, % of what it could owe")
    rental = rent(gpus=gpus, disk=disk, hold=max(1, could_owe * share // 100), ends_in=ends_in,
                  **clocks)  # fmt: skip
    Rental.objects.filter(pk=rental.pk).update(
        price_per_gpu_hour=price, storage_price_per_gb_month=storage_price
    )
    return rental


def _bank(rental: Rental, at, *, gpu: bool, storage: bool) -> None:
    """Stop the clocks the way the clock followers do: bank the running time up to ``at``."""
    if gpu and rental.gpu_clock_since is not None:
        rental.gpu_seconds, rental.gpu_clock_since = rental.gpu_seconds_at(at), None
    if storage and rental.storage_clock_since is not None:
        rental.storage_seconds = rental.storage_seconds_at(at)
        rental.storage_clock_since = None


def _happen(event: str, rental: Rental, at, renter_team, data) -> None:
    """What happened to the rental at ``at`` between two sweeps, written as the services that
    follow instances, machines, bids and extensions leave it."""
    rental.refresh_from_db()
    if rental.settled_at is not None:
        return
    if event == "stop":  # the instance stopped: GPU time stops, storage goes on
        _bank(rental, at, gpu=True, storage=False)
    elif event == "start":
        rental.gpu_clock_since = rental.gpu_clock_since or at
    elif event == "offline":  # the machine left service: no charge until it is back
        _bank(rental, at, gpu=True, storage=True)
    elif event == "online":
        rental.gpu_clock_since = rental.gpu_clock_since or at
        rental.storage_clock_since = rental.storage_clock_since or at
    elif event == "extend":
        seconds = data.draw(st.integers(1, 48 * HOUR), label="extended by seconds")
        amount = extension_quote(rental, seconds).total
        if amount:
            key = f"extend-{rental.pk}-{at.isoformat()}"
            credit_grant(team_id=renter_team.pk, amount=amount, reason="t", idempotency_key=key)
            hold_extend(hold_id=rental.hold_id, amount=amount, idempotency_key=key)
        rental.ends_at += timedelta(seconds=seconds)
    elif event == "reprice":  # a new bid: what was owed at the old price is banked
        rental_bank_gpu_owed(rental, at)
        rental.price_per_gpu_hour = data.draw(st.integers(0, 9_000_000), label="new price")
    elif event == "end":  # destroyed: the clocks stop, the usage is captured, the rest released
        _bank(rental, at, gpu=True, storage=True)
        rental.save()
        rental_meter(rental=rental, now=at)
        hold_release(hold_id=rental.hold_id)
        rental.settled_at = at
    rental.save()


def _due(hold: Hold, owed_gpu: int, owed_storage: int) -> Capture:
    return capture_due(
        amount=hold.amount,
        captured_gpu=hold.captured_gpu,
        captured_storage=hold.captured_storage,
        released=hold.released,
        owed_gpu=owed_gpu,
        owed_storage=owed_storage,
        percent=platform_fee_percent(),
    )


@contextmanager
def _rolled_back():
    """One example's rentals and ledger, gone afterwards (examples never meet)."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


@hypothesis.settings(
    max_examples=examples(40), suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_the_sql_sweep_captures_what_the_python_rule_says(rent, renter_team, data):
    """The sweep on PostgreSQL computes what rentals owe and what holds capture in SQL
    (``_OWED_SQL``, ``pg_settle``); the Python rule is ``rental_owed`` and ``capture_due``.
    On generated rentals (GPU counts, prices, banked amounts, part-seconds, holds nearly or
    wholly used up) and sweeps between which rentals end, stop, start, go offline and come
    back, are extended or repriced or destroyed, every capture of every sweep is what the
    Python rule says: GPU time, storage and fee, to the micro-dollar. (On SQLite the sweep is
    the Python twin, held to the same.)"""
    percent = data.draw(st.sampled_from(FEE_PERCENTS), label="fee %")
    advances = data.draw(
        st.lists(
            st.tuples(st.integers(0, 2 * 24 * HOUR), st.integers(0, 999_999)),
            min_size=1,
            max_size=4,
        ),
        label="sweeps, (seconds, microseconds) after the one before",
    )
    span = sum(seconds for seconds, _ in advances) + 1
    with override_settings(PLATFORM_FEE_PERCENT=percent), _rolled_back():
        count = data.draw(st.integers(1, 4), label="rentals")
        rentals = [_draw_rental(data, rent, renter_team, span) for _ in range(count)]
        swept_at = rent.now
        for seconds, micro in advances:
            before, swept_at = swept_at, swept_at + timedelta(seconds=seconds, microseconds=micro)
            for rental in rentals:
                event = data.draw(st.sampled_from(EVENTS), label=f"rental {rental.pk}")
                if event != "none":
                    part = data.draw(st.integers(0, 1_000), label="when, ‰ of the way")
                    _happen(event, rental, before + (swept_at - before) * part / 1_000,
                            renter_team, data)  # fmt: skip

            expected = {}
            for rental in Rental.objects.filter(settled_at=None):
                hold = Hold.objects.get(pk=rental.hold_id)
                owed = rental_owed(rental, swept_at)
                due = _due(hold, owed.gpu, owed.storage)
                if hold.status == HoldStatus.OPEN and due.amount:
                    expected[hold.pk] = (due.gpu, due.storage, due.fee)
            captures_before = set(Transfer.objects.values_list("pk", flat=True))

            assert metering_sweep(now=swept_at) == sum(g + s for g, s, _ in expected.values())
            captured = {
                hold_id: (amount - storage, storage, fee)
                for hold_id, amount, storage, fee in Transfer.objects.filter(
                    kind=TransferKind.CAPTURE
                )
                .exclude(pk__in=captures_before)
                .values_list("hold_id", "amount", "storage_amount", "fee")
            }
            assert captured == expected
        assert_ledger_consistent()
