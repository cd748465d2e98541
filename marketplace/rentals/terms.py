"""A rental's request and the checks of its terms, whoever rents (API, console, the vast.ai
facade, the platform placing replicas): what may run, for how long, on how many GPUs or how
big a slice, at which bid, with which disk. ``renting.py`` allocates and holds for what passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError

from hosts.models import Machine
from marketplace.rentals.bids import bid_check
from marketplace.rentals.volume_mounts import MountRequest
from marketplace.services.pricing import MAX_RENTAL_HOURS, MIN_RENTAL_HOURS
from marketplace.validation import label_check, registry_login_check, validate_launch
from scheduler.models import LaunchMode
from scheduler.placement import BINPACK, CARD_POLICIES, SliceSize
from scheduler.services import JUPYTER_CONTAINER_PORT, SSH_CONTAINER_PORT


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
    label: str = ""
    # A slice of one card instead of whole GPUs (gpu_count is then 1), placed on the card
    # ``card_policy`` picks: binpack the fullest that fits, spread the emptiest.
    gpu_slice: SliceSize | None = None
    card_policy: str = BINPACK
    volumes: tuple[MountRequest, ...] = ()
    # An interruptible rental at this bid per GPU-hour (micro-dollars) instead of the
    # machine's price; None: on demand.
    bid: int | None = None


def request_check(request: RentalRequest) -> None:
    """What the renter asks to run, checked here whoever calls (API, console, a script), so
    nothing invalid is ever allocated, held or stored (hosts.runtime checks the final spec
    again before any command is built)."""
    label_check(request.label)
    registry_login_check(username=request.registry_username, password=request.registry_password)
    if request.launch_mode not in LaunchMode.values:
        raise ValidationError({"launch_mode": f"Choose one of {', '.join(LaunchMode.values)}."})
    validate_launch(
        image=request.image,
        env=dict(request.env or {}),
        ports=list(request.ports or []),
        entrypoint=request.entrypoint,
        args=list(request.args or []),
    )


def terms_check(
    *,
    machine: Machine,
    request: RentalRequest,
    now: datetime,
    windows: list,
    largest_card_memory_mb: int,
) -> datetime:
    """The rental's end, or ValidationError naming each term it breaks. ``windows`` are the
    machine's maintenance windows (start, end) that end after ``now``."""
    errors: dict[str, str] = {}
    present = machine.gpu_count
    if request.bid is not None:
        try:
            bid_check(machine, request.bid)
        except ValidationError as error:
            errors.update({k: v[0] for k, v in error.message_dict.items()})
        if request.gpu_slice is not None:
            errors["bid_price"] = "Interruptible rentals take whole GPUs; rent a slice on demand."
    if request.gpu_slice is not None:
        errors.update(_slice_errors(machine, request, largest_card_memory_mb))
    elif request.gpu_count < max(machine.min_gpus, 1):
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
    if "duration_hours" not in errors and any(
        starts_at < ends_at and window_end > now for starts_at, window_end in windows
    ):
        errors["duration_hours"] = "The rental would overlap a maintenance window of this machine."
    max_disk = int(machine.unit_disk_gb * max(request.gpu_count, 1))
    if request.gpu_slice is not None:
        if request.disk_gb < 1:  # its most is its fraction of a unit, checked on its card
            errors["disk_gb"] = "Choose at least 1 GB."
    elif not (1 <= request.disk_gb <= max(max_disk, 1)):
        errors["disk_gb"] = f"Choose between 1 and {max_disk} GB for {request.gpu_count} GPU(s)."
    if errors:
        raise ValidationError(errors)
    return ends_at


def _slice_errors(machine: Machine, request: RentalRequest, largest: int) -> dict[str, str]:
    """What refuses a slice on this machine whatever its cards hold now (400s; a card too full
    now is a 409 from ``FreeCapacity.take_slice``)."""
    size = request.gpu_slice
    if not machine.sharing_enabled:
        return {
            "gpu_share": "This machine does not share its GPUs; rent whole GPUs (num_gpus) "
            "or choose an offer with gpu_frac."
        }
    if request.gpu_count != 1:
        return {"num_gpus": "A slice is part of one GPU: leave num_gpus out or set it to 1."}
    if request.card_policy not in CARD_POLICIES:
        return {"card_policy": f"Choose one of {', '.join(CARD_POLICIES)}."}
    low = machine.sharing_min_core_percent
    if not (low <= size.core_percent <= 100):
        return {"gpu_share": f"core_percent: this machine shares from {low} to 100 percent."}
    if not (1 <= size.memory_mb <= largest):
        return {
            "gpu_share": f"memory_mb: this machine's cards have {largest} MB; ask for 1 to {largest}."
        }
    return {}


def container_ports(request: RentalRequest) -> list[int]:
    ports = list(dict.fromkeys(request.ports or []))
    if request.launch_mode == LaunchMode.SSH and SSH_CONTAINER_PORT not in ports:
        ports.insert(0, SSH_CONTAINER_PORT)
    if request.launch_mode == LaunchMode.JUPYTER and JUPYTER_CONTAINER_PORT not in ports:
        ports.insert(0, JUPYTER_CONTAINER_PORT)
    return ports
