"""Placing queued replicas: the placement engine picks machines for many deployments' queued
replicas, and one ``rentals_create`` rents them all.

A pass over one deployment (an event woke it) plans over the offers that meet its
conditions; the beat sweep's passes over many deployments share one snapshot of every
rentable offer (``Fleet.whole``), read once, each replica's request carrying its deployment's
conditions. The planner counts what it hands out, so replicas planned together never share a
GPU; ``rentals_create`` checks each order again under the machines' row locks, and a machine
that refuses (taken meanwhile, gone offline) is dropped from the snapshot and its replica
planned again elsewhere, for a few rounds. A replica that finds no machine waits, and its
deployment says why (``conditions.queue_reason``), as it does when credit or its budget runs
out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property

from django.db import DatabaseError
from django.db.models import F, QuerySet, Sum

from billing.errors import InsufficientCredit
from billing.models import Hold
from billing.usd import format_usd
from core.pg_bulk import bulk_set
from marketplace.deployments.conditions import matching_offers, placement_request, queue_reason
from marketplace.models import Deployment, Offer, Rental, Replica
from marketplace.models.deployments import ReplicaState
from marketplace.rentals.renting import RentalRequest, Rented, rentals_create
from marketplace.services.pricing import quote_at, slice_rate
from scheduler.placement import Card, MachineSnapshot, Placement, Planner
from scheduler.services import NoCapacity

logger = logging.getLogger(__name__)

# A machine that refuses drops out and its replica is planned again, at most this many times
# in one pass (the next pass tries again).
ROUNDS = 3


class Fleet:
    """The placement engine over a snapshot of offers (read on first use), and each machine's
    prices for the budget."""

    def __init__(self, offers: QuerySet[Offer]):
        self._offers = offers
        self.prices: dict[int, tuple[int, int]] = {}
        self.card_memory: dict[int, int] = {}  # sharing machines' cards, for a slice's rate

    @classmethod
    def matching(cls, deployment: Deployment) -> Fleet:
        return cls(matching_offers(deployment))

    @classmethod
    def whole(cls) -> Fleet:
        return cls(Offer.objects.filter(rentable=True, all_free=True))

    @cached_property
    def planner(self) -> Planner:
        """Renting picks the GPUs itself, so the free GPUs need only be counted, not named."""
        rows = self._offers.values_list(
            "machine_id", "gpu_name", "num_gpus", "price_per_gpu_hour", "reliability",
            "geolocation", "min_gpus", "disk_per_unit", "storage_cost", "sharing", "cards",
            "min_slice_core_percent",
        )  # fmt: skip
        snapshots = []
        for (
            machine_id, name, free, price, reliability, region, min_gpus, disk, storage,
            sharing, cards, min_slice,
        ) in rows:  # fmt: skip
            free_ids, card_rows = tuple(range(free)), ()
            if sharing:  # the offer's cards by index; whole free ones are the whole units
                card_rows = tuple(
                    Card(c["gpu_index"], c["free_core_percent"], c["free_memory_mb"],
                         c["memory_mb"])
                    for c in cards
                )  # fmt: skip
                free_ids = tuple(c.gpu_id for c in card_rows if c.whole_free)
                self.card_memory[machine_id] = max((c.memory_mb for c in card_rows), default=1)
            snapshots.append(
                MachineSnapshot(
                    machine_id=machine_id,
                    gpu_name=name.upper(),
                    free_gpu_ids=free_ids,
                    price_per_gpu_hour=price,
                    reliability=reliability,
                    region=region,
                    min_gpus=min_gpus,
                    disk_per_gpu_gb=disk,
                    cards=card_rows,
                    min_slice_core_percent=min_slice,
                )  # fmt: skip
            )
            self.prices[machine_id] = (price, storage)
        return Planner(snapshots)

    def release(self, placement: Placement) -> None:
        """Give a placement back to the snapshot (its rental was refused after all)."""
        if placement.gpu_slice is not None:
            [card] = placement.gpu_ids
            self.planner.release_slice(placement.machine_id, card, placement.gpu_slice)
        else:
            self.planner.release(placement.machine_id, placement.gpu_ids)

    def replica_cost(self, deployment: Deployment, machine_id: int) -> int:
        price, storage = self.prices[machine_id]
        size = deployment.gpu_slice
        if size is not None:
            price = slice_rate(price, size, self.card_memory.get(machine_id, 1))
        return quote_at(
            price_per_gpu_hour=price,
            storage_price_per_gb_month=storage,
            gpu_count=deployment.gpus_per_replica,
            disk_gb=deployment.disk_gb,
            hours=deployment.duration_hours,
        ).total


@dataclass(eq=False)
class Placing:
    """One deployment's queued replicas to place in a pass, and how it went: how many were
    placed, and why the rest wait ("" when none does)."""

    deployment: Deployment
    queued: list[Replica]
    avoid: set[int]  # machines its live replicas are on (spread goes elsewhere first)
    spec: str  # the spec hash its new replicas run
    placed: int = 0
    reason: str = ""
    no_room: bool = False  # the planner found no machine for one of them
    committed: int | None = field(default=None, repr=False)  # budget spent or held so far


@dataclass(frozen=True)
class _Planned:
    placing: Placing
    replica: Replica
    placement: Placement
    cost: int

    @property
    def machine_id(self) -> int:
        return self.placement.machine_id


def place_queued(placings: list[Placing], fleet: Fleet) -> None:
    """Place as many queued replicas as fit, in order, each deployment's on the machines its
    policy prefers; rented in one batch per round."""
    for _ in range(ROUNDS):
        planned = [p for placing in placings for p in _plan(placing, fleet)]
        retry = _rent(planned, fleet) if planned else set()
        for placing in placings:
            placing.queued = [r for r in placing.queued if r.pk in retry]
        if not retry:
            break
    for placing in placings:
        if placing.no_room:
            # Worded now that the offers show what this batch rented.
            placing.reason = queue_reason(placing.deployment)
        elif placing.queued and not placing.reason:
            placing.reason = "the machines chosen refused (taken meanwhile); trying again"


def _plan(placing: Placing, fleet: Fleet) -> list[_Planned]:
    """Machines for the placing's queued replicas, until none fits or the budget is reached."""
    deployment = placing.deployment
    planned = []
    for replica in placing.queued:
        placement = fleet.planner.place(placement_request(deployment, avoid=placing.avoid))
        if placement is None:
            placing.no_room = True
            break
        cost = fleet.replica_cost(deployment, placement.machine_id)
        over = _over_budget(placing, cost)
        if over:
            fleet.release(placement)
            placing.reason = over
            break
        placing.avoid.add(placement.machine_id)
        planned.append(_Planned(placing, replica, placement, cost))
        if placing.committed is not None:
            placing.committed += cost
    return planned


def _rent(planned: list[_Planned], fleet: Fleet) -> set[int]:
    """Rent the planned replicas' machines; returns the replicas to plan again elsewhere."""
    orders = [
        (p.placing.deployment.team, rental_request(p.placing.deployment, p.machine_id))
        for p in planned
    ]
    try:
        outcomes = rentals_create(orders)
    except (NoCapacity, DatabaseError) as error:  # the batch rolled back whole: all wait
        logger.warning("placing %s replicas failed: %s", len(planned), error)
        for p in planned:
            p.placing.reason = f"placing failed, trying again: {error}"
            p.placing.queued = []
        return set()
    retry: list[_Planned] = []
    short_of_credit: set[Placing] = set()
    placed = []
    for p, outcome in zip(planned, outcomes, strict=True):
        if isinstance(outcome, Rented):
            p.replica.instance = outcome.instance
            p.replica.state = ReplicaState.PLACED
            p.replica.spec_hash = p.placing.spec
            p.placing.placed += 1
            placed.append(p.replica)
            continue
        _unspend(p)
        if isinstance(outcome, InsufficientCredit):
            fleet.release(p.placement)
            p.placing.reason = f"not enough credit to place a replica: {outcome}"
            short_of_credit.add(p.placing)
        else:  # OfferUnavailable, NoCapacity, ValidationError: this machine, not the replica
            logger.info(
                "deployment %s: machine %s refused: %s",
                p.placing.deployment.pk,
                p.machine_id,
                outcome,
            )
            fleet.planner.forget(p.machine_id)
            p.placing.avoid.discard(p.machine_id)
            retry.append(p)
    bulk_set(Replica, ["instance", "state", "spec_hash"], placed)
    # A deployment short of credit places nothing more in this pass.
    return {p.replica.pk for p in retry if p.placing not in short_of_credit}


def _unspend(planned: _Planned) -> None:
    if planned.placing.committed is not None:
        planned.placing.committed -= planned.cost


def budget_committed(deployment: Deployment) -> int:
    """What the deployment's rentals have spent or still hold: their holds less what was
    released (a destroyed replica's unused time goes back to the budget)."""
    holds = Hold.objects.filter(
        pk__in=Rental.objects.filter(instance__replica__deployment=deployment).values("hold_id")
    )
    return holds.aggregate(total=Sum(F("amount") - F("released")))["total"] or 0


def _over_budget(placing: Placing, cost: int) -> str:
    """Why one more replica at ``cost`` would pass the deployment's budget, or ""."""
    deployment = placing.deployment
    if deployment.budget is None:
        return ""
    if placing.committed is None:
        placing.committed = budget_committed(deployment)
    if placing.committed + cost <= deployment.budget:
        return ""
    return (
        f"the budget of {format_usd(deployment.budget)} is reached: its replicas have spent or "
        f"hold {format_usd(placing.committed)}, and one more needs {format_usd(cost)}"
    )


def rental_request(deployment: Deployment, machine_id: int) -> RentalRequest:
    return RentalRequest(
        machine_id=machine_id,
        gpu_count=deployment.gpus_per_replica,
        image=deployment.image,
        hours=deployment.duration_hours,
        disk_gb=deployment.disk_gb,
        launch_mode=deployment.launch_mode,
        env=dict(deployment.env),
        ports=list(deployment.ports),
        entrypoint=deployment.entrypoint,
        args=list(deployment.args),
        gpu_slice=deployment.gpu_slice,
        card_policy=deployment.card_policy,
    )
