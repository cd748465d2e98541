"""Pricing: what renting or extending holds, in integer micro-dollars rounded once from
seconds, at the machine's prices (renting) or the rental's (extending)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from billing import holds
from billing.money import usage_owed
from hosts.models import Machine
from marketplace.models import Rental
from scheduler.placement import SliceSize, slice_fraction

# How long a rental (or a volume's period) may be held for, and extended by, at once.
MAX_RENTAL_HOURS = 24 * 365
MIN_RENTAL_HOURS = 0.01  # 36 seconds: less would hold nothing

SECONDS_PER_MONTH = 30 * 24 * 3600


def storage_owed(*, price_per_gb_month: int, disk_gb: int, seconds: int) -> int:
    """Storage for ``seconds``, rounded once (half up); a month is 30 days."""
    numerator = price_per_gb_month * disk_gb * seconds
    return (numerator + SECONDS_PER_MONTH // 2) // SECONDS_PER_MONTH


@dataclass(frozen=True)
class Quote:
    gpu: int
    storage: int

    @property
    def total(self) -> int:
        return self.gpu + self.storage


def slice_rate(price_per_gpu_hour: int, size: SliceSize, card_memory_mb: int) -> int:
    """A slice's hourly rate in micro-dollars: the card's rate × the larger of its compute and
    memory fractions, rounded once (half up). It is the rental's rate for its one unit, fixed at
    renting, so metering, invoices and earnings treat it as any rental's."""
    exact = price_per_gpu_hour * slice_fraction(size.core_percent, size.memory_mb, card_memory_mb)
    return int(exact + Fraction(1, 2))  # floor(x + ½): half up, for x ≥ 0


def rental_quote(*, machine: Machine, gpu_count: int, disk_gb: int, hours: float) -> Quote:
    return quote_at(
        price_per_gpu_hour=machine.price_per_gpu_hour,
        storage_price_per_gb_month=machine.storage_price_per_gb_month,
        gpu_count=gpu_count,
        disk_gb=disk_gb,
        hours=hours,
    )


def quote_at(
    *,
    price_per_gpu_hour: int,
    storage_price_per_gb_month: int,
    gpu_count: int,
    disk_gb: int,
    hours: float,
) -> Quote:
    """What renting at these prices holds (a machine's, or an offer's as a snapshot read it)."""
    seconds = round(hours * 3600)
    return Quote(
        gpu=usage_owed(rate_per_hour=price_per_gpu_hour * gpu_count, seconds=seconds),
        storage=storage_owed(
            price_per_gb_month=storage_price_per_gb_month, disk_gb=disk_gb, seconds=seconds
        ),
    )


def rental_hold_grow(
    rental: Rental,
    *,
    now: datetime,
    idempotency_key: str,
    gpu_rate_per_hour: int = 0,
    disk_gb: int = 0,
) -> int:
    """Hold what ``gpu_rate_per_hour`` and ``disk_gb`` more cost from ``now`` to the rental's
    end, when its terms grow (a higher bid, more GPUs, a bigger disk): 402 when credit is
    short. Returns the amount held (0: nothing to hold)."""
    seconds = max(int((rental.ends_at - now).total_seconds()), 0)
    amount = usage_owed(rate_per_hour=gpu_rate_per_hour, seconds=seconds) + storage_owed(
        price_per_gb_month=rental.storage_price_per_gb_month, disk_gb=disk_gb, seconds=seconds
    )
    if amount:
        holds.hold_extend(hold_id=rental.hold_id, amount=amount, idempotency_key=idempotency_key)
    return amount


def extension_quote(rental: Rental, seconds: int) -> Quote:
    """What extending the rental by ``seconds`` holds: its GPUs and its storage, at the
    prices it was rented at. A stopped rental too: it may start again within the period."""
    return Quote(
        gpu=usage_owed(rate_per_hour=rental.price_per_gpu_hour * rental.gpu_count, seconds=seconds),
        storage=storage_owed(
            price_per_gb_month=rental.storage_price_per_gb_month,
            disk_gb=rental.disk_gb,
            seconds=seconds,
        ),
    )
