"""Listing terms: price, storage price, minimum GPUs, end date, region (a country), host ports; listing and
unlisting; the private ranges rentals may not reach; the commitments (rentals' end dates) that
higher rooms register."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from hosts.countries import country_code
from hosts.models import Machine, MachineStatus
from hosts.runtime import InvalidContainerSpec
from hosts.runtime.firewall import validate_blocked_ranges
from hosts.services.events import notify_changed, record_event

MAX_PRICE_PER_GPU_HOUR = 1_000 * 1_000_000  # $1,000/GPU-hour: anything above is a typo
MAX_STORAGE_PRICE = 100 * 1_000_000  # $100/GB-month


# Higher rooms register how to tell until when the machine is committed (its rentals' end
# dates): fn(machine_id) -> the latest such moment, or None. hosts imports none of them.
_commitment_sources: list[Callable[[int], datetime | None]] = []


def register_commitments(source: Callable[[int], datetime | None]) -> None:
    """Add a source of commitments: ``source(machine_id) -> latest end or None``."""
    if source not in _commitment_sources:
        _commitment_sources.append(source)


def committed_until(machine_id: int) -> datetime | None:
    """The latest end of what the machine is committed to (None when nothing is)."""
    ends = [end for source in _commitment_sources if (end := source(machine_id)) is not None]
    return max(ends, default=None)


KEEP = object()  # a term left as the machine has it


@transaction.atomic
def machine_set_terms(
    *,
    machine_id: int,
    price_per_gpu_hour: int,
    storage_price_per_gb_month: int,
    min_gpus: int,
    end_date: datetime | None,
    location: str,
    port_range_start: int | None = None,
    port_range_end: int | None = None,
    min_bid_price_per_gpu_hour: int | None | object = KEEP,
) -> Machine:
    """Listing terms. They apply to new rentals; running rentals keep the price they got.
    ``min_bid_price_per_gpu_hour`` is the lowest bid the machine takes for interruptible
    rentals (None: it takes no bids; left out: as it was).

    The end date may not come before the end of a rental already made (no rental may run
    past it); the machine row lock keeps a rental from being made meanwhile."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    errors = {}
    if not (0 <= price_per_gpu_hour <= MAX_PRICE_PER_GPU_HOUR):
        errors["price_per_gpu_hour"] = "Between $0 and $1,000 per GPU-hour."
    if not (0 <= storage_price_per_gb_month <= MAX_STORAGE_PRICE):
        errors["storage_price_per_gb_month"] = "Between $0 and $100 per GB-month."
    gpus = machine.gpu_count
    if not (1 <= min_gpus <= max(gpus, 1)):
        errors["min_gpus"] = f"Between 1 and the machine's {gpus} GPU(s)."
    if end_date is not None and end_date <= timezone.now():
        errors["end_date"] = "The end date must be in the future."
    elif (
        end_date is not None and (committed := committed_until(machine_id)) and end_date < committed
    ):
        errors["end_date"] = (
            f"A rental on this machine runs until {committed:%Y-%m-%d %H:%M} UTC; "
            "the end date cannot come before it."
        )
    floor = min_bid_price_per_gpu_hour
    if floor is not KEEP and floor is not None and not (1 <= floor <= MAX_PRICE_PER_GPU_HOUR):
        errors["min_bid_price_per_gpu_hour"] = (
            "Between $0.000001 and $1,000 per GPU-hour, or none to take no bids."
        )
    location = location.strip()
    if location:  # the region is a country (ISO 3166-1 alpha-2), as offers are searched by
        code = country_code(location)
        if code is None:
            errors["location"] = (
                f"'{location[:64]}' is not a country: choose one from the list "
                "(an ISO 3166 code like US or DE, or its name)."
            )
        location = code or ""
    start = port_range_start or machine.port_range_start
    end = port_range_end or machine.port_range_end
    if not (1024 <= start <= end <= 65535):
        errors["port_range_start"] = "A range of host ports within 1024-65535, start ≤ end."
    if errors:
        raise ValidationError(errors)
    machine.price_per_gpu_hour = price_per_gpu_hour
    machine.storage_price_per_gb_month = storage_price_per_gb_month
    machine.min_gpus, machine.end_date, machine.location = min_gpus, end_date, location
    machine.port_range_start, machine.port_range_end = start, end
    if min_bid_price_per_gpu_hour is not KEEP:
        machine.min_bid_price_per_gpu_hour = min_bid_price_per_gpu_hour
    machine.save()
    record_event(machine, "terms", _terms_summary(machine))
    notify_changed(machine, "terms")
    return machine


@transaction.atomic
def machine_set_listed(*, machine_id: int, listed: bool) -> Machine:
    """List or unlist; unlisting never touches running rentals, it only stops new ones."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    if listed and (machine.status != MachineStatus.ONLINE or machine.gpu_count == 0):
        raise ValidationError({"listed": "Only an online machine with GPUs can be listed."})
    if listed and machine.price_per_gpu_hour <= 0:
        raise ValidationError({"listed": "Set a price per GPU-hour first."})
    machine.listed = listed
    machine.save(update_fields=["listed"])
    record_event(machine, "listing", "Listed" if listed else "Unlisted (running rentals continue)")
    notify_changed(machine, "listing")
    return machine


@transaction.atomic
def machine_set_blocked_ranges(*, machine_id: int, ranges: list[str]) -> Machine:
    """The provider's private ranges (IPv4 CIDRs) its rentals may not reach, besides the host
    and link-local addresses; the host's rules follow at the next probe (the caller queues
    one)."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    try:
        machine.blocked_ranges = validate_blocked_ranges(ranges)
    except InvalidContainerSpec as error:
        raise ValidationError({"blocked_ranges": error.reason}) from None
    machine.save(update_fields=["blocked_ranges"])
    record_event(
        machine,
        "blocked_ranges",
        "Rentals may not reach: " + (", ".join(machine.blocked_ranges) or "no range of yours"),
    )
    notify_changed(machine, "terms")
    return machine


def _terms_summary(machine: Machine) -> str:
    until = f", until {machine.end_date:%Y-%m-%d}" if machine.end_date else ""
    floor = machine.min_bid_price_per_gpu_hour
    bids = f", bids from ${floor / 1_000_000:.4g}/GPU-hour" if floor else ", no bids"
    return (
        f"Terms: ${machine.price_per_gpu_hour / 1_000_000:.4g}/GPU-hour, "
        f"${machine.storage_price_per_gb_month / 1_000_000:.4g}/GB-month storage, "
        f"min {machine.min_gpus} GPU(s), region {machine.location or '—'}{until}{bids}"
    )
