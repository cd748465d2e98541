"""Renting and extending: the rental's terms, checked and held for in one transaction.

Renting locks the machine row, checks the terms, allocates GPUs and host ports, places the
hold, creates the rental and its instance. Any failure (409 GPU taken, 402 short credit, 400
bad input) rolls all of it back, so nothing is held or written. The launch is queued only when
the transaction commits.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from billing import holds
from hosts.models import Machine, MachineStatus
from hosts.selectors import maintenance_overlapping
from marketplace.events import publish_instance_event
from marketplace.fleet import machine_reference
from marketplace.models import Rental, Team
from marketplace.models.rentals import rental_reference
from marketplace.services.clocks import ENDED_STATES
from marketplace.services.offers import offer_refresh
from marketplace.services.pricing import extension_quote, rental_quote
from marketplace.services.registries import registry_check, registry_login_seal
from marketplace.validation import validate_launch
from scheduler.models import Instance, InstanceEvent, InstanceState, LaunchMode
from scheduler.services import JUPYTER_CONTAINER_PORT, SSH_CONTAINER_PORT, allocation_create
from scheduler.work import work_enqueue_on_commit

MAX_RENTAL_HOURS = 24 * 365
MIN_RENTAL_HOURS = 0.01  # 36 seconds: less would hold nothing


class OfferUnavailable(Exception):
    http_status = 409
    error_code = "offer_unavailable"


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


def rental_create(*, team: Team, request: RentalRequest) -> Rental:
    """Rent units of a machine: allocate, hold credit, create rental + instance, all or none.

    Raises OfferUnavailable (409) for a machine that is not rentable, NoCapacity (409) when
    its GPUs were taken meanwhile, InsufficientCredit (402) when credit is short, and
    ValidationError (400, naming the field) for terms the rental breaks.
    """
    _validate_request(request)
    registry_check(machine_id=request.machine_id, image=request.image)
    with transaction.atomic():
        machine = Machine.objects.select_for_update().filter(pk=request.machine_id).first()
        if machine is None or not machine.listed or machine.status != MachineStatus.ONLINE:
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
            registry_credential=registry_login_seal(
                username=request.registry_username, password=request.registry_password
            ),
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
            reference=rental_reference(instance.pk),
            idempotency_key=f"rental:{instance.uuid}:hold",
            description=f"{request.gpu_count}× GPU on machine {machine.pk} for {request.hours:g} h",
            machine_reference=machine_reference(machine.pk),
        )
        rental = Rental.objects.create(
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
            {
                "id": instance.pk,
                "state": InstanceState.LAUNCHING.value,
                "from": "",
                "reason": "Rented",
            },
        )
        offer_refresh(machine_id=machine.pk)
        work_enqueue_on_commit(instance.pk, InstanceState.LAUNCHING)
    return rental


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


def rental_extend(*, rental: Rental, hours: float) -> Rental:
    """Add ``hours`` to the rental and as much to its hold (402 if credit is short)."""
    if not (MIN_RENTAL_HOURS <= hours <= MAX_RENTAL_HOURS):  # (NaN fails both)
        raise ValidationError(
            {
                "hours": f"Extend by at least {MIN_RENTAL_HOURS} and at most {MAX_RENTAL_HOURS} hours."
            }
        )
    with transaction.atomic():
        # The machine first, as renting and changing the terms lock it: its end date and
        # maintenance windows cannot move while this checks them. Then the rental alone
        # (``of``: a join would lock the instance too, in no order we choose).
        machine = Machine.objects.select_for_update().get(pk=rental.machine_id)
        rental = (
            Rental.objects.select_for_update(of=("self",))
            .select_related("instance")
            .get(pk=rental.pk)
        )
        if rental.settled_at is not None or rental.instance.state in ENDED_STATES:
            raise ValidationError({"hours": "This rental has ended; rent again instead."})
        new_end = rental.ends_at + timedelta(hours=hours)
        if machine.end_date and new_end > machine.end_date:
            raise ValidationError(
                {"hours": f"The machine is offered until {machine.end_date:%Y-%m-%d %H:%M} UTC."}
            )
        window = maintenance_overlapping(machine.pk, rental.ends_at, new_end)
        if window is not None:
            raise ValidationError(
                {
                    "hours": f"The machine has maintenance from {window.starts_at:%Y-%m-%d %H:%M}"
                    " UTC; extend to before it."
                }
            )
        quote = extension_quote(rental, round(hours * 3600))
        holds.hold_extend(
            hold_id=rental.hold_id,
            amount=quote.total,
            idempotency_key=f"rental:{rental.instance.uuid}:extend:{new_end.isoformat()}",
        )
        rental.ends_at = new_end
        rental.save(update_fields=["ends_at"])
    return rental
