"""Interruptible rentals: the bid market on a machine.

A renter may rent whole GPUs at a **bid** per GPU-hour instead of the machine's price, on a
machine whose provider set a minimum bid (``Machine.min_bid_price_per_gpu_hour``). The rental
is **interruptible**: it is charged its bid while it runs, and

- an on-demand rental takes GPUs that interruptible rentals hold when too few are free
  (the lowest bid first; among equal bids, the newest rental first);
- a bid takes GPUs that bids lower by at least ``BID_STEP`` hold;
- the rental that loses its GPUs is **interrupted**: it stops at once (its GPU charge stops,
  its storage goes on, its data is kept) and waits (``Rental.interrupted_at``);
- it wins them back when its GPUs are free again or held by bids it beats
  (``machine_bids_resolve``), and starts again on the same GPUs.

Every change of hands happens under the machine's row lock, in one transaction with the
allocations, so the GPUs never belong to two rentals; the rental's clocks follow its instance
as for any stop or start.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from billing import holds
from billing.usd import format_usd
from core.task_queue import task_queue
from hosts.models import Machine, MachineStatus
from hosts.runtime import CommandFailed, HostUnreachable
from marketplace.models import Rental
from marketplace.rentals.locking import machine_and_rental_locked
from marketplace.rentals.metering import BANK_GPU_FIELDS, rental_bank_gpu_owed
from marketplace.services.pricing import rental_hold_grow
from scheduler.models import GpuAllocation, Instance, InstanceState
from scheduler.services import (
    INTERRUPTIBLE_STATES,
    InvalidTransition,
    NoCapacity,
    gpu_allocation_reclaim,
    instance_interrupt,
    instance_start,
    live_gpu_allocations,
    sliced_gpu_ids,
)
from scheduler.work import work_enqueue_on_commit

logger = logging.getLogger(__name__)

# The least a bid must beat another by to take its GPUs: $0.001 per GPU-hour.
BID_STEP = 1_000
# The most a bid may be (per GPU-hour): far above any card's price, it keeps a mistyped bid
# from holding a renter's whole balance.
MAX_BID = 1_000 * 1_000_000


@dataclass
class Bidder:
    """An interruptible rental holding GPUs on a machine."""

    instance_id: int
    bid: int
    gpu_ids: list[int]
    rented_at: datetime


def interruption_order(bidder: Bidder) -> tuple:
    """The order bidders lose their GPUs in: the lowest bid first, the newest first."""
    return (bidder.bid, -bidder.rented_at.timestamp())


def running_bids(machine_ids) -> dict[int, list[Bidder]]:
    """Interruptible rentals holding GPUs on these machines (the caller holds their locks),
    per machine in the order they are interrupted: the lowest bid first, the newest first."""
    rows = (
        live_gpu_allocations()
        .filter(
            gpu__machine_id__in=list(machine_ids),
            instance__state__in=INTERRUPTIBLE_STATES,
            instance__rental__interruptible=True,
        )
        .order_by("gpu__index")
        .values_list(
            "gpu__machine_id",
            "instance_id",
            "gpu_id",
            "instance__rental__price_per_gpu_hour",
            "instance__rental__created_at",
        )
    )
    by_instance: dict[int, Bidder] = {}
    machine_of: dict[int, int] = {}
    for machine_id, instance_id, gpu_id, bid, rented_at in rows:
        bidder = by_instance.setdefault(instance_id, Bidder(instance_id, bid, [], rented_at))
        bidder.gpu_ids.append(gpu_id)
        machine_of[instance_id] = machine_id
    bids: dict[int, list[Bidder]] = defaultdict(list)
    for bidder in by_instance.values():
        bids[machine_of[bidder.instance_id]].append(bidder)
    for each in bids.values():
        each.sort(key=interruption_order)
    return bids


def bidders_to_interrupt(bidders: list[Bidder], gpus_needed: int, bid: int | None) -> list[Bidder]:
    """The first bidders (in interruption order) whose GPUs make up ``gpus_needed``, among
    those ``bid`` beats (any, for an on-demand rental: ``bid`` None). NoCapacity, saying what
    would win, when they cannot."""
    beaten = [b for b in bidders if bid is None or b.bid + BID_STEP <= bid]
    chosen: list[Bidder] = []
    freed = 0
    for bidder in beaten:
        if freed >= gpus_needed:
            break
        chosen.append(bidder)
        freed += len(bidder.gpu_ids)
    if freed >= gpus_needed:
        return chosen
    if bid is None:
        raise NoCapacity(
            f"Too few GPUs of this machine are free now: {gpus_needed} more were asked for "
            f"than are free, and interruptible rentals hold {freed}."
        )
    winnable = sum(len(b.gpu_ids) for b in bidders)
    if winnable >= gpus_needed:
        needed = _bid_that_wins(bidders, gpus_needed)
        raise NoCapacity(
            f"Interruptible rentals bidding more hold these GPUs: bid at least "
            f"{format_usd(needed)} per GPU-hour to take them."
        )
    raise NoCapacity("Too few GPUs of this machine are free or held by bids now.")


def _bid_that_wins(bidders: list[Bidder], gpus_needed: int) -> int:
    freed, highest = 0, 0
    for bidder in bidders:
        if freed >= gpus_needed:
            break
        freed += len(bidder.gpu_ids)
        highest = max(highest, bidder.bid)
    return highest + BID_STEP


def bid_check(machine: Machine, bid: int, *, field: str = "bid_price") -> None:
    """ValidationError naming ``field`` unless ``bid`` is a bid this machine takes."""
    floor = machine.min_bid_price_per_gpu_hour
    if floor is None:
        raise ValidationError(
            {
                field: "This machine takes no bids: its provider has set no minimum bid. "
                "Rent it on demand, or search offers with a min_bid."
            }  # fmt: skip
        )
    if bid < floor:
        raise ValidationError(
            {field: f"This machine takes bids from {format_usd(floor)} per GPU-hour."}
        )
    if bid > MAX_BID:
        raise ValidationError({field: f"Bid at most {format_usd(MAX_BID)} per GPU-hour."})


def min_bid(machine: Machine, bids: list[int]) -> int | None:
    """The offer's minimum bid: the machine's floor, or above the highest running bid when bids
    hold some of its GPUs (``bids``); None where it takes no bids."""
    floor = machine.min_bid_price_per_gpu_hour
    if floor is None:
        return None
    highest = max(bids, default=None)
    return floor if highest is None else max(floor, highest + BID_STEP)


def rentals_interrupt(instance_ids: list[int], *, reason: str, now: datetime) -> None:
    """Interrupt these interruptible rentals (the caller holds their machine's lock and gives
    their GPUs to whoever took them, in this transaction): each stops at once and waits."""
    for instance_id in instance_ids:
        instance_interrupt(instance_id=instance_id, reason=reason)
        work_enqueue_on_commit(instance_id, InstanceState.STOPPING)
    Rental.objects.filter(instance_id__in=instance_ids).update(interrupted_at=now)


def machine_bids_resolve(*, machine_id: int) -> list[int]:
    """Interrupted rentals of the machine that win their GPUs back now, highest bid first (the
    longest waiting first among equal bids): those whose GPUs are free, or held only by bids
    they beat (which are interrupted in turn). Each winner holds its GPUs from this
    transaction and is started by a worker. Returns the winners' instance ids."""
    now = timezone.now()
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        waiting = list(
            Rental.objects.select_for_update(of=("self",))
            .filter(
                machine_id=machine_id,
                interrupted_at__isnull=False,
                settled_at=None,
                ends_at__gt=now,
                instance__state=InstanceState.STOPPED,
            )
            .select_related("instance")
            .order_by("-price_per_gpu_hour", "interrupted_at", "pk")
        )
        if not waiting or machine.status != MachineStatus.ONLINE:
            return []
        winners = []
        for rental in waiting:
            if _win_back(machine, rental, now):
                winners.append(rental.instance_id)
        for instance_id in winners:
            transaction.on_commit(lambda instance_id=instance_id: _resume_later(instance_id))
    return winners


def machines_bids_resolve() -> int:
    """Resolve every machine where interrupted rentals wait; return how many won. One that
    fails is logged and left for the next run."""
    machine_ids = (
        Rental.objects.filter(interrupted_at__isnull=False, settled_at=None)
        .values_list("machine_id", flat=True)
        .distinct()
    )
    won = 0
    for machine_id in list(machine_ids):
        try:
            won += len(machine_bids_resolve(machine_id=machine_id))
        except Exception:
            logger.exception("could not settle the bids of machine %s", machine_id)
    return won


def bids_waiting(machine_id: int) -> bool:
    return Rental.objects.filter(
        machine_id=machine_id, interrupted_at__isnull=False, settled_at=None
    ).exists()


def _win_back(machine: Machine, rental: Rental, now: datetime) -> bool:
    """Give the waiting ``rental`` its GPUs back if they are free or held only by bids it
    beats (interrupting those); False, changing nothing, otherwise."""
    gpu_ids = last_gpu_ids(rental.instance)
    if not gpu_ids:
        return False
    holders = dict(
        live_gpu_allocations().filter(gpu_id__in=gpu_ids).values_list("gpu_id", "instance_id")
    )
    if sliced_gpu_ids([machine.pk]) & set(gpu_ids):
        return False  # a card of it is rented in slices now: not a bid's to take
    bidders = {b.instance_id: b for b in running_bids([machine.pk]).get(machine.pk, [])}
    losers = set(holders.values())
    if any(
        holder not in bidders or bidders[holder].bid + BID_STEP > rental.price_per_gpu_hour
        for holder in losers
    ):
        return False
    try:
        # One savepoint: if the GPUs cannot be taken after all (one went missing), nobody was
        # interrupted for it.
        with transaction.atomic():
            reason = outbid_reason(rental.price_per_gpu_hour)
            rentals_interrupt(sorted(losers), reason=reason, now=now)
            gpu_allocation_reclaim(instance=rental.instance)
    except NoCapacity:
        logger.warning("interrupted rental %s could not take its GPUs back", rental.pk)
        return False
    rental.interrupted_at = None
    rental.save(update_fields=["interrupted_at"])
    return True


def last_gpu_ids(instance: Instance) -> list[int]:
    """The GPUs the instance had when it last gave them up (its container is pinned to them)."""
    last = (
        GpuAllocation.objects.filter(instance=instance)
        .exclude(released_at=None)
        .order_by("-released_at")
        .values_list("released_at", flat=True)
        .first()
    )
    if last is None:
        return []
    return list(
        GpuAllocation.objects.filter(instance=instance, released_at=last).values_list(
            "gpu_id", flat=True
        )
    )


def outbid_reason(bid: int) -> str:
    return (
        f"Interrupted: a bid of {format_usd(bid)} per GPU-hour took its GPUs. Its data is kept; "
        "it starts again when it wins them back."
    )


ON_DEMAND_REASON = (
    "Interrupted: an on-demand rental took its GPUs. Its data is kept; it starts again when "
    "they are free."
)


def interrupted_note(instance_id: int) -> str | None:
    """Once an interrupted rental's container has stopped, its status says it waits (the
    stop's own words would read as the renter's stop); None for any other stopped rental."""
    bid = (
        Rental.objects.filter(instance_id=instance_id, interrupted_at__isnull=False)
        .values_list("price_per_gpu_hour", flat=True)
        .first()
    )
    if bid is None:
        return None
    note = (
        f"Interrupted: waiting to win its GPUs back at its bid of {format_usd(bid)} per "
        "GPU-hour (its data is kept; storage is still charged). Raise the bid to win sooner."
    )
    Instance.objects.filter(pk=instance_id, state=InstanceState.STOPPED).update(status_message=note)
    return note


def _resume_later(instance_id: int) -> None:
    task_queue("marketplace.tasks.rental_resume", instance_id)


def interrupted_rental_resume(*, instance_id: int) -> Instance | None:
    """Start a rental that won its GPUs back (``machine_bids_resolve`` gave them to it). When
    the host does not start it, it gives them up and waits again: the next resolve retries."""
    try:
        return instance_start(
            instance_id=instance_id,
            reason="Won its GPUs back: running again at its bid",
        )
    except (InvalidTransition, NoCapacity):
        return None  # destroyed, expired, started by the renter or outbid again meanwhile
    except (CommandFailed, HostUnreachable):
        logger.warning("interrupted rental of instance %s did not start again", instance_id)
        Rental.objects.filter(instance_id=instance_id, settled_at=None).update(
            interrupted_at=timezone.now()
        )
        return None


def winning_bid(*, rental: Rental) -> int:
    """The lowest bid per GPU-hour that holds (or wins back) the rental's GPUs now: the
    machine's floor, or above every other bid on them. ValidationError when an on-demand
    rental holds one (no bid wins it)."""
    machine = Machine.objects.get(pk=rental.machine_id)
    if machine.min_bid_price_per_gpu_hour is None:
        raise ValidationError({"bid_price": "This machine takes no bids any more."})
    gpu_ids = set(
        live_gpu_allocations()
        .filter(instance_id=rental.instance_id)
        .values_list("gpu_id", flat=True)
    ) or set(last_gpu_ids(rental.instance))
    others = (
        live_gpu_allocations()
        .filter(gpu_id__in=gpu_ids)
        .exclude(instance_id=rental.instance_id)
        .values_list("instance_id", flat=True)
    )
    bidders = {b.instance_id: b for b in running_bids([machine.pk]).get(machine.pk, [])}
    highest = 0
    for holder in set(others):
        if holder not in bidders:
            raise ValidationError(
                {
                    "bid_price": "An on-demand rental holds its GPUs now: no bid wins them "
                    "until it ends."
                }  # fmt: skip
            )
        highest = max(highest, bidders[holder].bid + BID_STEP)
    return max(machine.min_bid_price_per_gpu_hour, highest)


def rental_bid_change(*, rental: Rental, bid: int) -> Rental:
    """A new bid for an interruptible rental, from now on: what it owes at the old bid is
    banked, the hold grows when the new bid needs more for the rest of the period (402 when
    credit is short), and the machine's bids are settled again (a higher bid may win its GPUs
    back or take others'; a lower one may lose them to a waiting bid)."""
    with transaction.atomic():
        machine, rental = machine_and_rental_locked(rental)
        if not rental.interruptible:
            raise ValidationError(
                {"bid_price": "This rental is on demand: it has no bid to change."}
            )
        if rental.settled_at is not None or rental.ends_at <= timezone.now():
            raise ValidationError({"bid_price": "This rental has ended; rent again instead."})
        bid_check(machine, bid)
        now = timezone.now()
        extra = bid - rental.price_per_gpu_hour
        if extra > 0:
            rental_hold_grow(
                rental,
                now=now,
                gpu_rate_per_hour=extra * rental.gpu_count,
                idempotency_key=f"rental:{rental.instance.uuid}:bid:{now.isoformat()}",
            )
        holds.hold_lock_with_accounts(hold_id=rental.hold_id)
        rental_bank_gpu_owed(rental, now)
        rental.price_per_gpu_hour = bid
        rental.save(update_fields=[*BANK_GPU_FIELDS, "price_per_gpu_hour"])
    machine_bids_resolve(machine_id=machine.pk)
    rental.refresh_from_db()
    return rental
