"""Renting: the contract, its credit hold, its metering clocks, and the offers read model.

Renting is one transaction: lock the machine row, check the terms, allocate GPUs and host
ports, place the hold, create the contract and its instance. Any failure (409 GPU taken, 402
short credit, 400 bad input) rolls all of it back, so nothing is held or written. The launch
task is queued only when the transaction commits.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

import psycopg
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone
from psycopg.types.datetime import TimestamptzLoader

from billing import holds, metering
from billing.money import MICRO_PER_DOLLAR, usage_owed
from hosts.models import Machine, MachineStatus, in_service
from hosts.runtime import CommandResult, DockerHost, InvalidContainerSpec, check_registry
from hosts.selectors import maintenance_overlapping
from marketplace.db import release_database_connection
from marketplace.events import publish_instance_event
from marketplace.models import Contract, Offer, SshKey, Team
from marketplace.secrets_box import seal, unseal
from marketplace.validation import validate_launch
from scheduler.models import GpuAllocation, Instance, InstanceEvent, InstanceState, LaunchMode
from scheduler.services import (
    JUPYTER_CONTAINER_PORT,
    SSH_CONTAINER_PORT,
    InvalidTransition,
    allocation_create,
    instance_destroy_request,
    instance_start,
    instance_stop_request,
)
from scheduler.work import work_enqueue_on_commit

SECONDS_PER_MONTH = 30 * 24 * 3600
MAX_RENTAL_HOURS = 24 * 365
MIN_RENTAL_HOURS = 0.01  # 36 seconds: less would hold nothing

logger = logging.getLogger(__name__)


def data_grace() -> timedelta:
    """How long an expired rental's data is kept before it is deleted (DATA_GRACE_HOURS)."""
    return timedelta(hours=getattr(settings, "DATA_GRACE_HOURS", 48))


class OfferUnavailable(Exception):
    http_status = 409
    error_code = "offer_unavailable"


# --- pricing ------------------------------------------------------------------------------


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


def rental_quote(*, machine: Machine, gpu_count: int, disk_gb: int, hours: float) -> Quote:
    seconds = round(hours * 3600)
    return Quote(
        gpu=usage_owed(rate_per_hour=machine.price_per_gpu_hour * gpu_count, seconds=seconds),
        storage=storage_owed(
            price_per_gb_month=machine.storage_price_per_gb_month, disk_gb=disk_gb, seconds=seconds
        ),
    )


# --- offers -------------------------------------------------------------------------------


def short_gpu_name(name: str) -> str:
    """ "NVIDIA GeForce RTX 4090" → "RTX 4090", the way renters search for it."""
    return re.sub(r"^(NVIDIA\s+)?(GeForce\s+)?", "", name.strip()) or name


def offer_score(*, reliability: float, gpu_total_ram_gb: float, dph_total: int) -> float:
    """Value for money, weighted by reliability: GB of GPU memory per dollar-hour × r²."""
    dollars = max(dph_total / MICRO_PER_DOLLAR, 0.01)
    return round(reliability**2 * gpu_total_ram_gb / dollars, 4)


def offer_refresh(*, machine_id: int) -> Offer | None:
    """Recompute one machine's offer from the machine and its live allocations."""
    machine = (
        Machine.objects.filter(pk=machine_id)
        .annotate(
            present=Count("gpus", filter=Q(gpus__present=True), distinct=True),
        )
        .first()
    )
    if machine is None:
        return None
    taken = GpuAllocation.objects.filter(gpu=OuterRef("pk"), released_at=None)
    free = machine.gpus.filter(present=True).exclude(Exists(taken)).count()
    first_gpu = machine.gpus.filter(present=True).order_by("index").first()
    total = machine.present or 0
    now = timezone.now()
    rentable = bool(
        machine.listed
        and machine.status == "online"
        and first_gpu is not None
        and free >= max(machine.min_gpus, 1)
        and (machine.end_date is None or machine.end_date > now)
    )
    gpu_ram = (first_gpu.memory_mib / 1024) if first_gpu else 0.0
    dph_total = machine.price_per_gpu_hour * free
    values = {
        "provider_team_id": machine.team_id,
        "rentable": rentable,
        "gpu_name": short_gpu_name(first_gpu.name) if first_gpu else "",
        "num_gpus": free,
        "total_gpus": total,
        "min_gpus": machine.min_gpus,
        "gpu_ram": round(gpu_ram, 2),
        "cpu_cores_per_unit": machine.unit_cpus if total else 0,
        "cpu_ram_per_unit": round(machine.unit_memory_mb / 1024, 2) if total else 0,
        "disk_per_unit": float(machine.unit_disk_gb) if total else 0,
        "price_per_gpu_hour": machine.price_per_gpu_hour,
        "dph_total": dph_total,
        "storage_cost": machine.storage_price_per_gb_month,
        "reliability": machine.reliability,
        "end_date": machine.end_date,
        "geolocation": machine.location,
        "driver_version": machine.driver_version or "",
        "cuda_max_good": _float(machine.cuda_version),
        "verified": machine.verified,
        "score": offer_score(
            reliability=machine.reliability,
            gpu_total_ram_gb=gpu_ram * free,
            dph_total=dph_total,
        ),
    }
    offer, _ = Offer.objects.update_or_create(machine_id=machine.pk, defaults=values)
    return offer


def offers_refresh_all() -> int:
    count = 0
    for machine_id in Machine.objects.values_list("pk", flat=True).iterator():
        offer_refresh(machine_id=machine_id)
        count += 1
    return count


def _float(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


# --- renting ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RentalRequest:
    machine_id: int
    gpu_count: int
    image: str
    hours: float
    disk_gb: int = 10
    launch_mode: str = LaunchMode.ENTRYPOINT
    env: dict[str, str] | None = None
    ports: list[int] | None = None
    entrypoint: str = ""
    args: list[str] | None = None
    registry_username: str = ""
    registry_password: str = ""


def rental_create(*, team: Team, request: RentalRequest) -> Contract:
    """Rent units of a machine: allocate, hold credit, create contract + instance, all or none.

    Raises OfferUnavailable (409) for a machine that is not rentable, NoCapacity (409) when
    its GPUs were taken meanwhile, InsufficientCredit (402) when credit is short, and
    ValidationError (400, naming the field) for terms the rental breaks.
    """
    _validate_request(request)
    _check_registry(request)
    with transaction.atomic():
        machine = Machine.objects.select_for_update().filter(pk=request.machine_id).first()
        if machine is None or not machine.listed or machine.status != "online":
            raise OfferUnavailable("This machine is not offered for rent right now.")
        now = timezone.now()
        ends_at = _validate_terms(machine=machine, request=request, now=now)
        container_ports = _container_ports(request)
        instance = Instance.objects.create(
            team=team,
            machine=machine,
            gpu_count=request.gpu_count,
            image=request.image,
            launch_mode=request.launch_mode,
            entrypoint=request.entrypoint,
            args=list(request.args or []),
            env=dict(request.env or {}),
            disk_gb=request.disk_gb,
            registry_credential=_sealed_credential(request),
            jupyter_token=secrets.token_urlsafe(24)
            if request.launch_mode == LaunchMode.JUPYTER
            else "",
            status_message="Waiting for a worker",
            work_due_at=now,
        )
        allocation_create(
            machine=machine,
            instance=instance,
            gpu_count=request.gpu_count,
            container_ports=container_ports,
        )
        quote = rental_quote(
            machine=machine,
            gpu_count=request.gpu_count,
            disk_gb=request.disk_gb,
            hours=request.hours,
        )
        hold = holds.hold_create(
            team_id=team.pk,
            provider_team_id=machine.team_id,
            amount=quote.total,
            reference=f"rental:{instance.pk}",
            idempotency_key=f"rental:{instance.uuid}:hold",
            description=f"{request.gpu_count}× GPU on machine {machine.pk} for {request.hours:g} h",
            machine_reference=f"machine:{machine.pk}",
        )
        contract = Contract.objects.create(
            team=team,
            provider_team_id=machine.team_id,
            machine=machine,
            instance=instance,
            gpu_count=request.gpu_count,
            price_per_gpu_hour=machine.price_per_gpu_hour,
            storage_price_per_gb_month=machine.storage_price_per_gb_month,
            disk_gb=request.disk_gb,
            starts_at=now,
            ends_at=ends_at,
            hold_id=hold.pk,
            storage_clock_since=now,
        )
        InstanceEvent.objects.create(
            instance=instance,
            to_state=InstanceState.LAUNCHING,
            reason="Rented; waiting for a worker",
        )
        # The team's other consoles list it at once (sent only if this commits).
        publish_instance_event(
            team.pk,
            instance.pk,
            "instance.state",
            {"id": instance.pk, "state": "launching", "from": "", "reason": "Rented"},
        )
        offer_refresh(machine_id=machine.pk)
        work_enqueue_on_commit(instance.pk, InstanceState.LAUNCHING)
    return contract


def _validate_request(request: RentalRequest) -> None:
    """What the renter asks to run, checked here whoever calls (API, console, a script), so
    nothing invalid is ever allocated, held or stored (hosts.runtime checks the final spec
    again before any command is built)."""
    if request.launch_mode not in LaunchMode.values:
        raise ValidationError({"launch_mode": f"Choose one of {', '.join(LaunchMode.values)}."})
    validate_launch(
        image=request.image,
        env=dict(request.env or {}),
        ports=list(request.ports or []),
        entrypoint=request.entrypoint,
        args=list(request.args or []),
    )


def _check_registry(request: RentalRequest) -> None:
    """Refuse an image from a registry on the machine's own network unless its provider allows
    one (hosts.runtime.registry_refusal). Before any lock is taken: a name lookup may be slow."""
    allowed = (
        Machine.objects.filter(pk=request.machine_id)
        .values_list("allow_private_registries", flat=True)
        .first()
    )
    try:
        check_registry(request.image, allow_private=bool(allowed))
    except InvalidContainerSpec as error:
        raise ValidationError({error.field: error.reason}) from error


def _sealed_credential(request: RentalRequest) -> dict[str, str]:
    """A private registry login, the password encrypted at rest; {} for public images."""
    if not request.registry_username and not request.registry_password:
        return {}
    if not request.registry_username or not request.registry_password:
        raise ValidationError(
            {"registry_username": "Give both the registry user name and password, or neither."}
        )
    return {"username": request.registry_username, "password": seal(request.registry_password)}


class RegistryLoginUnreadable(Exception):
    """The rental's registry password was sealed under a secret key the platform no longer has."""


def registry_credentials(instance: Instance) -> tuple[str, str] | None:
    """The decrypted login for the instance's private registry, if it has one.

    A login that can no longer be opened raises RegistryLoginUnreadable: pulling without it
    would fail as a bare 'unauthorized' that tells the renter nothing.
    """
    stored = instance.registry_credential or {}
    if not stored.get("username"):
        return None
    password = unseal(stored.get("password", ""))
    if password is None:
        raise RegistryLoginUnreadable(
            "the registry password can no longer be read (the platform's secret key changed "
            "since it was given); rent again with the registry login"
        )
    return stored["username"], password


def _validate_terms(*, machine: Machine, request: RentalRequest, now: datetime) -> datetime:
    errors: dict[str, str] = {}
    present = machine.gpus.filter(present=True).count()
    if request.gpu_count < max(machine.min_gpus, 1):
        errors["num_gpus"] = f"This machine rents at least {machine.min_gpus} GPU(s) at a time."
    elif request.gpu_count > present:
        errors["num_gpus"] = f"This machine has {present} GPU(s)."
    # NaN fails every comparison, so it is refused by name before it reaches a timedelta.
    hours_ok = (
        math.isfinite(request.hours) and MIN_RENTAL_HOURS <= request.hours <= MAX_RENTAL_HOURS
    )
    if not hours_ok:
        errors["duration_hours"] = (
            f"Rent for at least {MIN_RENTAL_HOURS} and at most {MAX_RENTAL_HOURS} hours."
        )
    ends_at = now + timedelta(hours=request.hours if hours_ok else MIN_RENTAL_HOURS)
    if "duration_hours" not in errors and machine.end_date and ends_at > machine.end_date:
        errors["duration_hours"] = (
            f"The machine is offered until {machine.end_date:%Y-%m-%d %H:%M} UTC; "
            "choose a shorter duration."
        )
    if (
        "duration_hours" not in errors
        and machine.maintenance_windows.filter(starts_at__lt=ends_at, ends_at__gt=now).exists()
    ):
        errors["duration_hours"] = "The rental would overlap a maintenance window of this machine."
    max_disk = int(machine.unit_disk_gb * max(request.gpu_count, 1))
    if not (1 <= request.disk_gb <= max(max_disk, 1)):
        errors["disk_gb"] = f"Choose between 1 and {max_disk} GB for {request.gpu_count} GPU(s)."
    if errors:
        raise ValidationError(errors)
    return ends_at


def _container_ports(request: RentalRequest) -> list[int]:
    ports = list(dict.fromkeys(request.ports or []))
    if request.launch_mode == LaunchMode.SSH and SSH_CONTAINER_PORT not in ports:
        ports.insert(0, SSH_CONTAINER_PORT)
    if request.launch_mode == LaunchMode.JUPYTER and JUPYTER_CONTAINER_PORT not in ports:
        ports.insert(0, JUPYTER_CONTAINER_PORT)
    return ports


def extension_quote(contract: Contract, seconds: int) -> Quote:
    """What extending the contract by ``seconds`` holds: its GPUs and its storage, at the
    prices it was rented at. A stopped rental too: it may start again within the period."""
    return Quote(
        gpu=usage_owed(
            rate_per_hour=contract.price_per_gpu_hour * contract.gpu_count, seconds=seconds
        ),
        storage=storage_owed(
            price_per_gb_month=contract.storage_price_per_gb_month,
            disk_gb=contract.disk_gb,
            seconds=seconds,
        ),
    )


def rental_extend(*, contract: Contract, hours: float) -> Contract:
    """Add ``hours`` to the contract and as much to its hold (402 if credit is short)."""
    if not (MIN_RENTAL_HOURS <= hours <= MAX_RENTAL_HOURS):  # (NaN fails both)
        raise ValidationError(
            {
                "hours": f"Extend by at least {MIN_RENTAL_HOURS} and at most {MAX_RENTAL_HOURS} hours."
            }
        )
    with transaction.atomic():
        # The machine first, as renting and changing the terms lock it: its end date and
        # maintenance windows cannot move while this checks them. Then the contract alone
        # (``of``: a join would lock the instance too, in no order we choose).
        machine = Machine.objects.select_for_update().get(pk=contract.machine_id)
        contract = (
            Contract.objects.select_for_update(of=("self",))
            .select_related("instance")
            .get(pk=contract.pk)
        )
        if contract.settled_at is not None or contract.instance.state in ENDED_STATES:
            raise ValidationError({"hours": "This rental has ended; rent again instead."})
        new_end = contract.ends_at + timedelta(hours=hours)
        if machine.end_date and new_end > machine.end_date:
            raise ValidationError(
                {"hours": f"The machine is offered until {machine.end_date:%Y-%m-%d %H:%M} UTC."}
            )
        window = maintenance_overlapping(machine.pk, contract.ends_at, new_end)
        if window is not None:
            raise ValidationError(
                {
                    "hours": f"The machine has maintenance from {window.starts_at:%Y-%m-%d %H:%M}"
                    " UTC; extend to before it."
                }
            )
        quote = extension_quote(contract, round(hours * 3600))
        holds.hold_extend(
            hold_id=contract.hold_id,
            amount=quote.total,
            idempotency_key=f"rental:{contract.instance.uuid}:extend:{new_end.isoformat()}",
        )
        contract.ends_at = new_end
        contract.save(update_fields=["ends_at"])
    return contract


# --- metering -----------------------------------------------------------------------------


def contract_owed(contract: Contract, now: datetime) -> Quote:
    """What the contract owes for GPU time and storage up to ``now`` (cumulative), each
    rounded once from its clock's seconds."""
    return Quote(
        gpu=usage_owed(
            rate_per_hour=contract.price_per_gpu_hour * contract.gpu_count,
            seconds=contract.gpu_seconds_at(now),
        ),
        storage=storage_owed(
            price_per_gb_month=contract.storage_price_per_gb_month,
            disk_gb=contract.disk_gb,
            seconds=contract.storage_seconds_at(now),
        ),
    )


def contract_meter(*, contract: Contract, now: datetime | None = None) -> int:
    """Capture what is owed so far beyond what was captured (0 on a repeated run)."""
    if contract.settled_at is not None:
        return 0
    owed = contract_owed(contract, now or timezone.now())
    captured = holds.hold_capture_usage(hold_id=contract.hold_id, kind="gpu", owed_total=owed.gpu)
    captured += holds.hold_capture_usage(
        hold_id=contract.hold_id, kind="storage", owed_total=owed.storage
    )
    return captured


class _MeteredContract(NamedTuple):
    """The columns of an open contract that metering reads. It borrows Contract's own clock
    methods, so the sweep reads the clocks exactly as ``contract_meter`` does, without a model
    instance per contract (building 100,000 of them costs a second of every sweep)."""

    pk: int
    hold_id: int
    gpu_count: int
    price_per_gpu_hour: int
    storage_price_per_gb_month: int
    disk_gb: int
    ends_at: datetime
    gpu_seconds: int
    gpu_clock_since: datetime | None
    storage_seconds: int
    storage_clock_since: datetime | None

    billable_until = Contract.billable_until
    gpu_seconds_at = Contract.gpu_seconds_at
    storage_seconds_at = Contract.storage_seconds_at
    _running_seconds = Contract._running_seconds


def _open_contracts_after(last_pk: int, limit: int) -> list[_MeteredContract]:
    """The next ``limit`` open contracts after ``last_pk``, in primary-key order.

    On PostgreSQL the rows are read with psycopg's own timestamp loader (in C): Django's
    (in Python) costs a few microseconds a value, 1.5 s of every sweep over 100,000 contracts.
    """
    query = (
        Contract.objects.filter(settled_at=None, pk__gt=last_pk)
        .order_by("pk")
        .values_list(*_MeteredContract._fields)[:limit]
    )
    if connection.vendor != "postgresql":
        return [_MeteredContract(*row) for row in query]
    sql, params = query.query.sql_with_params()
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        cursor.execute(sql, params)
        return [_MeteredContract(*row) for row in cursor]


def metering_sweep(*, batch_size: int = 5000, now: datetime | None = None) -> int:
    """Capture every open contract's usage up to ``now``, in batches; return what was captured.

    Each batch of contracts (read in primary-key order, outside any transaction: the capture
    is a difference of cumulative totals taken under the hold's lock, so a contract that
    changed meanwhile is simply caught up by the next sweep) becomes one
    ``holds_settle_usage`` call: one transaction and one capture per hold for both kinds.
    Run again at the same ``now``, it captures nothing.
    """
    now = now or timezone.now()
    total = 0
    last_pk = 0
    with metering.cyclic_gc_paused():
        while batch := _open_contracts_after(last_pk, batch_size):
            usage = []
            for contract in batch:
                owed = contract_owed(contract, now)
                usage.append(metering.HoldUsage(contract.hold_id, owed.gpu, owed.storage))
            total += metering.holds_settle_usage(usage)
            last_pk = batch[-1].pk
    return total


def _clock_start(since: datetime | None, now: datetime) -> datetime:
    return since or now


def _gpu_clock_stop(contract: Contract, now: datetime) -> None:
    """Bank the GPU clock's running time (never past the contract's end) and stop it."""
    contract.gpu_seconds = contract.gpu_seconds_at(now)
    contract.gpu_clock_since = None


def _storage_clock_stop(contract: Contract, now: datetime) -> None:
    contract.storage_seconds = contract.storage_seconds_at(now)
    contract.storage_clock_since = None


GPU_CLOCK_STATES = {InstanceState.RUNNING, InstanceState.EXITED}
# The rental has ended: its period ran out, it failed (its launch failed or its container
# vanished: nothing is left to run or store), or its destruction was asked for. It settles then:
# what was used is captured and the rest of the hold goes back at once.
ENDED_STATES = {
    InstanceState.FAILED,
    InstanceState.EXPIRED,
    InstanceState.DESTROYING,
    InstanceState.DESTROYED,
}
# Ended rentals whose leftovers (data, a container) are deleted after the grace period.
GRACE_STATES = {InstanceState.EXPIRED, InstanceState.FAILED}


def _clocks_follow(
    contract: Contract, *, state: str, state_since: datetime, online: bool, now: datetime
) -> None:
    """The metering rule: GPU time runs while the instance holds its GPUs and runs (or exited
    on its own) on a machine in service; storage time runs until the rental ends, while the
    machine is in service. A clock already running keeps its start.

    A clock the instance's state stops is stopped when the instance entered that state
    (``state_since``), however late this runs; one the machine stops, now.
    """
    state_stop = min(state_since, now)
    if state not in GPU_CLOCK_STATES:
        _gpu_clock_stop(contract, state_stop)
    elif online:
        contract.gpu_clock_since = _clock_start(contract.gpu_clock_since, now)
    else:
        _gpu_clock_stop(contract, now)
    if state in ENDED_STATES:
        _storage_clock_stop(contract, state_stop)
    elif online:
        contract.storage_clock_since = _clock_start(contract.storage_clock_since, now)
    else:
        _storage_clock_stop(contract, now)


def _machine_in_service(machine_id: int) -> bool:
    return in_service(Machine.objects.values_list("status", flat=True).get(pk=machine_id))


def contract_follow_instance(*, instance_id: int) -> Contract | None:
    """Put the contract's clocks in step with its instance and machine as they are now, meter,
    and settle once the rental has ended (capture the usage, release the rest of the hold).

    It reads the current state rather than trusting an event's, so events handled late, twice
    or out of order all leave the same result, and ``contracts_resync`` can call it for any
    contract at any time.
    """
    with transaction.atomic():
        contract = (
            Contract.objects.select_for_update(of=("self",)).filter(instance_id=instance_id).first()
        )
        if contract is None or contract.settled_at is not None:
            return contract
        # The hold and its accounts are locked before the clock is read: a metering sweep
        # that is capturing this hold finishes first, so it never counts time past ``now``,
        # and capture-then-release takes no lock while holding another (see billing).
        holds.hold_lock_with_accounts(hold_id=contract.hold_id)
        now = timezone.now()
        state, state_since = Instance.objects.values_list("state", "state_changed_at").get(
            pk=instance_id
        )
        online = _machine_in_service(contract.machine_id)
        _clocks_follow(contract, state=state, state_since=state_since, online=online, now=now)
        contract.save()
        contract_meter(contract=contract, now=now)
        if state in ENDED_STATES:
            holds.hold_release(hold_id=contract.hold_id)
            contract.settled_at = now
            if state in GRACE_STATES:
                contract.data_delete_after = now + data_grace()
            contract.save(update_fields=["settled_at", "data_delete_after"])
    return contract


def contracts_follow_machine(*, machine_id: int) -> int:
    """The machine left service (stop its rentals' clocks) or came back (restart them), as
    its status is now: status events handled late or out of order end the same way.

    Only the clocks change here; the next metering sweep captures. Capturing here would lock
    one hold after another while holding the platform's revenue account, which a sweep
    batch holding the next of those holds could be waiting for.
    """
    now = timezone.now()
    changed = 0
    with transaction.atomic():
        contracts = list(
            Contract.objects.select_for_update(of=("self",))
            .filter(machine_id=machine_id, settled_at=None)
            .order_by("pk")
        )
        online = _machine_in_service(machine_id)  # read after the locks: the latest status
        instances = Instance.objects.filter(pk__in=[c.instance_id for c in contracts])
        states = {pk: (state, since) for pk, state, since in instances.values_list(
            "pk", "state", "state_changed_at"
        )}  # fmt: skip
        for contract in contracts:
            state, state_since = states[contract.instance_id]
            _clocks_follow(contract, state=state, state_since=state_since, online=online, now=now)
            contract.save()
            changed += 1
    return changed


def contracts_out_of_step():
    """Instance ids of open contracts that ``contract_follow_instance`` would change: clocks
    that disagree with the instance and the machine, or a rental that ended unsettled.

    Normally none: every state change is followed at once. What is left is what a lost event
    leaves (a worker killed between a change and its handler, a handler that failed).
    """
    online = Q(machine__status=MachineStatus.ONLINE)
    gpu_should_run = online & Q(instance__state__in=GPU_CLOCK_STATES)
    storage_should_run = online & ~Q(instance__state__in=ENDED_STATES)
    return (
        Contract.objects.filter(settled_at=None)
        .filter(
            Q(instance__state__in=ENDED_STATES)
            | (gpu_should_run & Q(gpu_clock_since=None))
            | (~gpu_should_run & Q(gpu_clock_since__isnull=False))
            | (storage_should_run & Q(storage_clock_since=None))
            | (~storage_should_run & Q(storage_clock_since__isnull=False))
        )
        .values_list("instance_id", flat=True)
    )


def contracts_resync() -> int:
    """Follow every contract that is out of step; return how many were. One that fails is
    logged and left for the next run, never stopping the others."""
    done = 0
    for instance_id in list(contracts_out_of_step()):
        try:
            contract_follow_instance(instance_id=instance_id)
            done += 1
        except Exception:
            logger.exception("could not bring the contract of instance %s in step", instance_id)
    return done


def contracts_due_to_expire(now: datetime | None = None):
    now = now or timezone.now()
    return Contract.objects.filter(settled_at=None, ends_at__lte=now).values_list(
        "instance_id", flat=True
    )


def contracts_due_for_data_deletion(now: datetime | None = None):
    now = now or timezone.now()
    return Contract.objects.filter(
        data_delete_after__lte=now, instance__state__in=GRACE_STATES
    ).values_list("instance_id", flat=True)


# --- SSH keys -----------------------------------------------------------------------------

SSH_KEY_TYPES = {
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
}


def ssh_key_fingerprint(public_key: str) -> str:
    """Validate an OpenSSH public key line and return its SHA256 fingerprint."""
    parts = public_key.strip().split()
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES or "\n" in public_key.strip():
        raise ValidationError(
            {"public_key": "Paste one OpenSSH public key line, like 'ssh-ed25519 AAAA… you@host'."}
        )
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise ValidationError({"public_key": "The key's base64 part is damaged."}) from None
    if not blob.startswith(len(parts[0]).to_bytes(4, "big") + parts[0].encode()):
        raise ValidationError({"public_key": "The key's type does not match its contents."})
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


@transaction.atomic
def ssh_key_add(*, team: Team, name: str, public_key: str) -> SshKey:
    name = name.strip()
    if not name:
        raise ValidationError({"name": "Give the key a name."})
    fingerprint = ssh_key_fingerprint(public_key)
    if SshKey.objects.filter(team=team, fingerprint=fingerprint).exists():
        raise ValidationError({"public_key": "This key is already on the team."})
    clean = " ".join(public_key.strip().split()[:3])
    return SshKey.objects.create(
        team=team, name=name[:80], public_key=clean, fingerprint=fingerprint
    )


def team_ssh_public_keys(team_id: int) -> list[str]:
    return list(SshKey.objects.filter(team_id=team_id).values_list("public_key", flat=True))


# --- renter actions (one place for the console and the API) -------------------------------


def rental_stop_request(*, instance: Instance) -> Instance:
    """Stop: the instance is stopping at once (GPU time is no longer charged from now) and a
    worker stops its container, trying until the host confirms; then its GPUs go back. Its
    storage is still charged."""
    with transaction.atomic():
        stopping = instance_stop_request(instance_id=instance.pk)
        work_enqueue_on_commit(instance.pk, InstanceState.STOPPING)
    return stopping


def rental_destroy_request(
    *, instance: Instance, reason: str = "Destroyed by the renter"
) -> Instance:
    """Destroy: the rental ends and settles at once (nothing is charged from now), and a worker
    removes the container and its data, trying until the host confirms."""
    with transaction.atomic():
        destroying = instance_destroy_request(instance_id=instance.pk, reason=reason)
        if destroying.state == InstanceState.DESTROYING:
            work_enqueue_on_commit(instance.pk, InstanceState.DESTROYING)
    return destroying


def rental_start(*, instance: Instance) -> Instance:
    """Start again with the same GPUs (409 if someone has them), within the rental period. A
    rental stopped before its container existed is launched again by a worker."""
    if instance.state == InstanceState.FAILED:
        raise InvalidTransition(
            "This rental ended when it failed, and nothing was charged after that; rent again."
        )
    if instance.contract.ends_at <= timezone.now():
        raise InvalidTransition("The rental period is over; extend it first.")
    # Not inside a transaction: instance_start commits the GPUs it takes back before it runs
    # `docker start` over SSH, which must hold no row locks.
    started = instance_start(instance_id=instance.pk)
    if started.state == InstanceState.LAUNCHING:
        work_enqueue_on_commit(instance.pk, InstanceState.LAUNCHING)
    return started


# A command run from a request holds it (and its worker thread) meanwhile: bounded.
EXEC_TIMEOUT = 30.0


def rental_exec(*, instance: Instance, command: str) -> CommandResult:
    """Run a shell command inside the renter's own running container, for at most
    EXEC_TIMEOUT seconds."""
    if instance.state != InstanceState.RUNNING:
        raise InvalidTransition("Commands run only in a running instance.")
    host = DockerHost(instance.machine)
    release_database_connection()
    return host.exec(instance.container_id, ["sh", "-c", command], timeout=EXEC_TIMEOUT)
