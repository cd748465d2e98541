"""Renting: the rental's terms, checked and held for in one transaction (extending one:
``marketplace.rentals.extending``).

Renting locks the machine rows, checks the terms, allocates GPUs and host ports, places the
holds, creates the rentals and their instances. A failure (409 GPU taken, 402 short credit, 400
bad input) refuses that order alone and writes nothing for it. The launches are queued only
when the transaction commits. One renter's rental and the platform's batch of placements take
the same path (``rentals_create``), so they cannot drift apart.
"""

from __future__ import annotations

import contextvars
import secrets
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from prometheus_client import Histogram

from billing import holds
from billing.errors import InsufficientCredit
from core.group_commit import GroupCommit
from core.pg_bulk import insert_models
from hosts.models import Machine, MachineStatus, MaintenanceWindow
from hosts.runtime.registries import registry_of
from marketplace.events import publish_team_events
from marketplace.fleet import machine_reference
from marketplace.models import Rental, Team
from marketplace.models.rentals import rental_reference
from marketplace.rentals.bids import (
    ON_DEMAND_REASON,
    Bidder,
    bidders_to_interrupt,
    outbid_reason,
    rentals_interrupt,
    running_bids,
)
from marketplace.rentals.terms import MAX_RENTAL_HOURS as MAX_RENTAL_HOURS
from marketplace.rentals.terms import MIN_RENTAL_HOURS as MIN_RENTAL_HOURS
from marketplace.rentals.terms import RentalRequest as RentalRequest
from marketplace.rentals.terms import container_ports, request_check, terms_check
from marketplace.rentals.versions import committed_image_check
from marketplace.rentals.volume_mounts import mounts_check, mounts_lock_ready, mounts_write
from marketplace.services.offers import offers_refresh
from marketplace.services.pricing import (
    Quote,
    quote_at,
    slice_rate,
)
from marketplace.services.registries import registry_check, registry_login_seal
from scheduler.models import Instance, InstanceEvent, InstanceState, LaunchMode, PortAllocation
from scheduler.placement import slice_fraction
from scheduler.services import (
    CapacityTrial,
    FreeCapacity,
    NoCapacity,
    allocations_write,
)
from scheduler.services.allocations import SliceTaken
from scheduler.work import work_enqueue_many_on_commit

# What ``allocations_write`` writes every port allocation as (the model's default).
PORT_PROTOCOL = PortAllocation._meta.get_field("protocol").default


class OfferUnavailable(Exception):
    http_status = 409
    error_code = "offer_unavailable"


@dataclass(frozen=True)
class Rented:
    """What one rent wrote: the rental (its instance and machine with it, in memory) and what
    it was given, as written, so its answer shows them without reading them back."""

    rental: Rental
    gpu_uuids: list[str]
    ports: list[tuple[int, int, str]]  # (container port, host port, protocol)

    @property
    def instance(self) -> Instance:
        return self.rental.instance


def rental_create(*, team: Team, request: RentalRequest) -> Rented:
    """Rent units of a machine: allocate, hold credit, create rental + instance, all or none.

    Raises OfferUnavailable (409) for a machine that is not rentable, NoCapacity (409) when
    its GPUs were taken meanwhile, InsufficientCredit (402) when credit is short, and
    ValidationError (400, naming the field) for terms the rental breaks.
    """
    return _renting_together.submit((team, request))


RentalOrder = tuple[Team, RentalRequest]


def rentals_create(
    orders: list[RentalOrder], contexts: list[contextvars.Context] | None = None
) -> list[Rented | Exception]:
    """Rent for many orders at once, each as ``rental_create`` would, in one transaction and a
    few statements whatever their number (the platform placing a deployment's replicas rents
    hundreds). Returns, in order, each order's ``Rented`` or the error that refused it (the
    exceptions ``rental_create`` raises); a refused order writes nothing, the others are
    rented. Orders on one machine are served in order from what is free on it.

    ``contexts``, one for each order: the context its launch is queued in (the request that
    placed it, whose log context the launch task carries).
    """
    checked = _Checked(orders)  # before any lock: a name lookup may be slow
    with transaction.atomic():
        return _rentals_place(orders, contexts, checked)


def _rentals_together(
    orders: list[RentalOrder], contexts: list[contextvars.Context]
) -> list[Rented | Exception]:
    """``rentals_create`` for group commit, in the transaction it opened for the batch (a
    nested ``atomic`` would cost a savepoint and its release)."""
    return _rentals_place(orders, contexts, _Checked(orders))


class _Checked:
    """What is checked of each order before any row is locked: its outcome so far (the error
    that refused it, or None), the registry credential its image needs, the volumes it mounts."""

    def __init__(self, orders: list[RentalOrder]) -> None:
        self.outcomes: list[Rented | Exception | None] = [None] * len(orders)
        self.credentials = _check_orders(orders, self.outcomes)
        self.mounts = _check_mounts(orders, self.outcomes)


def _rentals_place(
    orders: list[RentalOrder], contexts: list[contextvars.Context] | None, checked: _Checked
) -> list[Rented | Exception]:
    """The orders ``checked`` passed, placed in the caller's transaction."""
    outcomes, credentials, mounts = checked.outcomes, checked.credentials, checked.mounts
    pending = [i for i, outcome in enumerate(outcomes) if outcome is None]
    machine_ids = sorted({orders[i][1].machine_id for i in pending})
    machines = {
        machine.pk: machine
        for machine in Machine.objects.select_for_update().filter(pk__in=machine_ids).order_by("pk")
    }
    pending = _mounts_still_ready(pending, mounts, outcomes)
    capacity = FreeCapacity(list(machines.values()))
    now = timezone.now()
    windows = _maintenance_windows(machine_ids, now)
    hold_accounts = holds.hold_accounts_lock({orders[i][0].pk for i in pending})
    credit = hold_accounts.credit_available()
    bidders = _Bidders(machine_ids)
    accepted: list[_Accepted] = []
    for i in pending:
        team, request = orders[i]
        try:
            # A refusal anywhere in here drops the trial: nothing of the order was taken.
            with capacity.trial(request.machine_id) as trial:
                terms = _accept(
                    request, machines.get(request.machine_id), trial, bidders, windows, now
                )
                if credit[team.pk] < terms.quote.total:
                    raise InsufficientCredit(needed=terms.quote.total, available=credit[team.pk])
                trial.commit()
        except (OfferUnavailable, ValidationError, NoCapacity, InsufficientCredit) as error:
            outcomes[i] = error
            continue
        bidders.interrupted(request.machine_id, terms.interrupts)
        credit[team.pk] -= terms.quote.total
        accepted.append(
            _Accepted(i, team, request, machines[request.machine_id], terms, mounts.get(i, []))
        )
    # The GPUs change hands before the new allocations are written (one live allocation
    # per GPU): the interrupted rentals stop and wait, the new ones launch once their
    # containers have stopped (``gpus_vacate``).
    for a in accepted:
        if a.terms.interrupts:
            reason = ON_DEMAND_REASON if a.request.bid is None else outbid_reason(a.request.bid)
            rentals_interrupt([b.instance_id for b in a.terms.interrupts], reason=reason, now=now)
    written = _rentals_write(accepted, credentials, hold_accounts, now, contexts)
    for i, rented in zip([a.index for a in accepted], written, strict=True):
        outcomes[i] = rented
    return outcomes  # type: ignore[return-value]  (every order has its outcome now)


@dataclass(frozen=True)
class _Terms:
    ends_at: datetime
    gpu_ids: list[int]
    ports: list[tuple[int, int]]
    quote: Quote
    price_per_gpu_hour: int  # the machine's (a slice's: the card's times its fraction), or the bid
    slice_: SliceTaken | None = None
    interrupts: list[Bidder] = ()  # interruptible rentals whose GPUs this one takes
    gpu_uuids: list[str] = ()  # its GPUs' (a slice's: its card's), in index order


@dataclass(frozen=True)
class _Accepted:
    index: int
    team: Team
    request: RentalRequest
    machine: Machine
    terms: _Terms
    mounts: list = ()  # (Volume, path inside) the rental mounts


def _check_mounts(orders: list[RentalOrder], outcomes: list) -> dict[int, list]:
    """The volumes each order mounts, checked against its team's (the outcome of one that
    fails is its error)."""
    mounts = {}
    for i, (team, request) in enumerate(orders):
        if outcomes[i] is not None or not request.volumes:
            continue
        try:
            mounts[i] = mounts_check(
                team=team, machine_id=request.machine_id, requested=list(request.volumes)
            )
        except ValidationError as error:
            outcomes[i] = error
    return mounts


def _mounts_still_ready(pending: list[int], mounts: dict[int, list], outcomes: list) -> list[int]:
    """Lock the volumes the orders mount, after the machines; an order whose volume was
    deleted meanwhile is refused."""
    wanted = [volume.pk for i in pending for volume, _ in mounts.get(i, [])]
    if not wanted:
        return pending
    ready = mounts_lock_ready(wanted)
    still = []
    for i in pending:
        gone = [volume.pk for volume, _ in mounts.get(i, []) if volume.pk not in ready]
        if gone:
            outcomes[i] = ValidationError({"volumes": f"Volume {gone[0]} was deleted."})
        else:
            still.append(i)
    return still


def _check_orders(orders: list[RentalOrder], outcomes: list) -> dict[int, dict[str, str]]:
    """What each order asks to run, checked (the outcome of one that fails is its error), and
    its registry login sealed. Identical specs are checked once."""
    # Whether a machine allows private registries matters only for an image from a registry
    # other than Docker Hub (``registry_refusal``): asked only for those (a rent of a Hub image
    # spends no statement on it).
    elsewhere = {
        request.machine_id for _, request in orders if registry_of(request.image) != "docker.io"
    }
    allow_private = (
        dict(Machine.objects.filter(pk__in=elsewhere).values_list("pk", "allow_private_registries"))
        if elsewhere
        else {}
    )
    checked: dict[tuple, ValidationError | None] = {}
    credentials: dict[int, dict[str, str]] = {}
    for i, (team, request) in enumerate(orders):
        key = (
            request.launch_mode, request.image, repr(request.env), repr(request.ports),
            request.entrypoint, repr(request.args), request.label,
            request.registry_username, request.registry_password,
            bool(allow_private.get(request.machine_id)),
        )  # fmt: skip
        if key not in checked:
            try:
                request_check(request)
                registry_check(image=request.image, allow_private=key[-1])
                checked[key] = None
            except ValidationError as error:
                checked[key] = error
        try:
            if checked[key] is not None:
                raise checked[key]
            committed_image_check(team=team, machine_id=request.machine_id, image=request.image)
            credentials[i] = registry_login_seal(
                username=request.registry_username, password=request.registry_password
            )
        except ValidationError as error:
            outcomes[i] = error
    return credentials


def _maintenance_windows(machine_ids: list[int], now: datetime) -> dict[int, list]:
    windows: dict[int, list] = defaultdict(list)
    rows = MaintenanceWindow.objects.filter(machine_id__in=machine_ids, ends_at__gt=now)
    for machine_id, starts_at, ends_at in rows.values_list("machine_id", "starts_at", "ends_at"):
        windows[machine_id].append((starts_at, ends_at))
    return windows


class _Bidders:
    """The running interruptible rentals of the locked machines, read when an order first
    needs more GPUs than are free there; an interrupted one leaves the list."""

    def __init__(self, machine_ids: list[int]):
        self._machine_ids = machine_ids
        self._bids: dict[int, list[Bidder]] | None = None

    def on(self, machine_id: int) -> list[Bidder]:
        if self._bids is None:
            self._bids = running_bids(self._machine_ids)
        return self._bids.setdefault(machine_id, [])

    def choose(self, machine_id: int, gpus_needed: int, bid: int | None) -> list[Bidder]:
        """The rentals to interrupt for ``gpus_needed`` more GPUs (NoCapacity when ``bid``
        cannot have them). They stay on the list until ``interrupted``."""
        return bidders_to_interrupt(self.on(machine_id), gpus_needed, bid)

    def interrupted(self, machine_id: int, chosen: list[Bidder]) -> None:
        """The order that interrupts ``chosen`` was accepted: they leave the list."""
        if chosen:
            bidders = self.on(machine_id)
            bidders[:] = [b for b in bidders if b not in chosen]


def _accept(
    request: RentalRequest,
    machine: Machine | None,
    trial: CapacityTrial,
    bidders: _Bidders,
    windows: dict,
    now: datetime,
) -> _Terms:
    """The order's terms on its locked machine, its GPUs and ports taken in ``trial`` (and
    from interruptible rentals it outbids, lent to it); raises what refuses it."""
    if machine is None or not machine.listed or machine.status != MachineStatus.ONLINE:
        raise OfferUnavailable("This machine is not offered for rent right now.")
    capacity = trial.capacity
    machine.present_gpu_count = capacity.present[machine.pk]
    ends_at = terms_check(
        machine=machine,
        request=request,
        now=now,
        windows=windows[machine.pk],
        largest_card_memory_mb=capacity.largest_card_memory_mb[machine.pk],
    )
    if request.gpu_slice is not None:
        return _accept_slice(request, machine, trial, ends_at)
    short = request.gpu_count - trial.free_gpu_count
    interrupts = []
    if short > 0 and (request.bid is not None or bidders.on(machine.pk)):
        interrupts = bidders.choose(machine.pk, short, request.bid)
        for bidder in interrupts:
            trial.lend(bidder.gpu_ids)
    gpu_ids, ports = trial.take(request.gpu_count, container_ports(request))
    rate = machine.price_per_gpu_hour if request.bid is None else request.bid
    quote = quote_at(
        price_per_gpu_hour=rate,
        storage_price_per_gb_month=machine.storage_price_per_gb_month,
        gpu_count=request.gpu_count,
        disk_gb=request.disk_gb,
        hours=request.hours,
    )
    return _Terms(
        ends_at=ends_at,
        gpu_ids=gpu_ids,
        ports=ports,
        quote=quote,
        price_per_gpu_hour=rate,
        interrupts=interrupts,
        gpu_uuids=capacity.gpu_uuids(machine.pk, gpu_ids),
    )


def _accept_slice(
    request: RentalRequest, machine: Machine, trial: CapacityTrial, ends_at: datetime
) -> _Terms:
    """A slice's terms: a card with room for it (``card_policy`` picks which), its rate (the
    card's times its fraction), and the disk its fraction of a unit allows."""
    size = request.gpu_slice
    slice_ = trial.take_slice(size.core_percent, size.memory_mb, request.card_policy)
    card_memory = trial.capacity.card_memory_mb(slice_.gpu_id)
    rate = slice_rate(machine.price_per_gpu_hour, size, card_memory)
    fraction = slice_fraction(size.core_percent, size.memory_mb, card_memory)
    max_disk = max(int(machine.unit_disk_gb * fraction), 1)
    if request.disk_gb > max_disk:
        raise ValidationError(
            {"disk_gb": f"Choose between 1 and {max_disk} GB for this slice of a card."}
        )
    _, ports = trial.take(0, container_ports(request))
    quote = quote_at(
        price_per_gpu_hour=rate,
        storage_price_per_gb_month=machine.storage_price_per_gb_month,
        gpu_count=1,
        disk_gb=request.disk_gb,
        hours=request.hours,
    )
    return _Terms(
        ends_at=ends_at,
        gpu_ids=[],
        ports=ports,
        quote=quote,
        price_per_gpu_hour=rate,
        slice_=slice_,
        gpu_uuids=trial.capacity.gpu_uuids(machine.pk, [slice_.gpu_id]),
    )


def _rentals_write(
    accepted: list[_Accepted],
    credentials: dict[int, dict[str, str]],
    hold_accounts: holds.HoldAccounts,
    now: datetime,
    contexts: list[contextvars.Context] | None,
) -> list[Rented]:
    """Instances, allocations, holds, rentals and events of the accepted orders, a statement
    or two each; launches queued and consoles told on commit."""
    if not accepted:
        return []
    instances = [_instance_for(a, credentials[a.index], now) for a in accepted]
    insert_models(Instance, instances)
    for a, instance in zip(accepted, instances, strict=True):
        if a.mounts:
            mounts_write(instance, a.mounts)
    # No savepoint: an error here ends ``rentals_create``'s transaction (or its savepoint)
    # whole, as one from the holds does.
    allocations_write(
        [
            (instance, a.terms.gpu_ids, a.terms.ports, a.terms.slice_)
            for a, instance in zip(accepted, instances, strict=True)
        ],
        savepoint=False,
    )
    hold_rows = holds.holds_create_many(
        [
            holds.HoldRequest(
                team_id=a.team.pk,
                provider_team_id=a.machine.team_id,
                amount=a.terms.quote.total,
                reference=rental_reference(instance.pk),
                idempotency_key=f"rental:{instance.uuid}:hold",
                description=f"{_what_rented(a.request)} on machine {a.machine.pk} for {a.request.hours:g} h",
                machine_reference=machine_reference(a.machine.pk),
            )
            for a, instance in zip(accepted, instances, strict=True)
        ],
        # Locked before the terms were checked; interrupting rentals posts nothing to them.
        locked=hold_accounts,
    )
    rentals = [
        Rental(
            team=a.team,
            provider_team_id=a.machine.team_id,
            machine=a.machine,
            instance=instance,
            gpu_count=a.request.gpu_count,
            price_per_gpu_hour=a.terms.price_per_gpu_hour,
            storage_price_per_gb_month=a.machine.storage_price_per_gb_month,
            disk_gb=a.request.disk_gb,
            starts_at=now,
            ends_at=a.terms.ends_at,
            hold_id=hold.pk,
            storage_clock_since=now,
            interruptible=a.request.bid is not None,
        )
        for a, instance, hold in zip(accepted, instances, hold_rows, strict=True)
    ]
    insert_models(Rental, rentals)
    insert_models(
        InstanceEvent,
        [
            InstanceEvent(
                instance=instance,
                to_state=InstanceState.LAUNCHING,
                reason="Rented; waiting for a worker",
            )
            for instance in instances
        ],
    )
    _tell_consoles(instances)
    rented = {a.machine.pk: a.machine for a in accepted}
    offers_refresh(rented, machines=list(rented.values()))
    # One message for the batch's launches, each task in the log context of its own order.
    work_enqueue_many_on_commit(
        [instance.pk for instance in instances],
        InstanceState.LAUNCHING,
        [contexts[a.index] for a in accepted] if contexts else None,
    )
    return [
        Rented(
            rental=rental,
            gpu_uuids=list(a.terms.gpu_uuids),
            ports=[(container, host, PORT_PROTOCOL) for container, host in sorted(a.terms.ports)],
        )
        for a, rental in zip(accepted, rentals, strict=True)
    ]


def _what_rented(request: RentalRequest) -> str:
    size = request.gpu_slice
    if size is None:
        return f"{request.gpu_count}× GPU"
    return f"{size.core_percent}% / {size.memory_mb} MB slice of a GPU"


def _tell_consoles(instances: list[Instance]) -> None:
    """The teams' consoles list the new instances at once (sent only if this commits): one
    event per team, which refreshes its lists once however many replicas a batch placed;
    ``id`` for one instance, ``ids`` for several."""
    by_team: dict[int, list[int]] = defaultdict(list)
    for instance in instances:
        by_team[instance.team_id].append(instance.pk)
    events = []
    for team_id, ids in by_team.items():
        data = {"state": InstanceState.LAUNCHING.value, "from": "", "reason": "Rented"}
        data.update({"id": ids[0]} if len(ids) == 1 else {"ids": ids})
        events.append((team_id, data))
    publish_team_events("instance.state", events)
    # The providers' machine pages count what is rented: theirs changed too.
    machines = {instance.machine_id: instance.machine.team_id for instance in instances}
    publish_team_events(
        "machine.changed",
        [
            (team_id, {"id": machine_id, "what": "rentals"})
            for machine_id, team_id in machines.items()
        ],
    )


def _instance_for(accepted: _Accepted, credential: dict[str, str], now: datetime) -> Instance:
    request = accepted.request
    return Instance(
        team=accepted.team,
        machine=accepted.machine,
        gpu_count=request.gpu_count,
        image=request.image,
        launch_mode=request.launch_mode,
        entrypoint=request.entrypoint,
        args=list(request.args or []),
        env=dict(request.env or {}),
        disk_gb=request.disk_gb,
        slice_core_percent=request.gpu_slice.core_percent if request.gpu_slice else None,
        slice_memory_mb=request.gpu_slice.memory_mb if request.gpu_slice else None,
        volumes=[[volume.docker_name, target] for volume, target in accepted.mounts],
        registry_credential=credential,
        jupyter_token=secrets.token_urlsafe(24)
        if request.launch_mode == LaunchMode.JUPYTER
        else "",
        status_message="Waiting for a worker",
        work_due_at=now,
        label=request.label,
    )


# Rents arriving together at this process (concurrent requests) are placed in one transaction.
_renting_together = GroupCommit(
    _rentals_together,
    gather=lambda: settings.RENT_GATHER_MS / 1000,
    enabled=lambda: settings.RENT_GROUP_COMMIT,
    sizes=Histogram(
        "gpumkt_rent_batch_orders",
        "Rent orders placed by one transaction (concurrent rents at a web process go together).",
        buckets=(1, 2, 4, 8, 16, 32),
    ),
)
