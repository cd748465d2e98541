"""Maintenance windows: announced periods no new rental may overlap."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from hosts.models import Machine, MaintenanceWindow
from hosts.services.events import notify_changed, record_event
from hosts.user_text import name_problem

MAX_MAINTENANCE = timedelta(days=14)
MAINTENANCE_HORIZON = timedelta(days=365)


@transaction.atomic
def maintenance_window_add(
    *, machine_id: int, starts_at: datetime, ends_at: datetime, note: str = ""
) -> MaintenanceWindow:
    """Announce a maintenance window. No new rental may overlap one (the scheduler asks
    ``hosts.selectors.maintenance_overlapping``); running rentals are not touched.

    A machine's windows never overlap each other: the machine row is locked while checking,
    so two concurrent adds cannot both pass.
    """
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    errors: dict[str, str] = {}
    now = timezone.now()
    if starts_at is None or timezone.is_naive(starts_at):
        errors["starts_at"] = "A start date and time with a time zone."
    if ends_at is None or timezone.is_naive(ends_at):
        errors["ends_at"] = "An end date and time with a time zone."
    if not errors:
        if ends_at <= starts_at:
            errors["ends_at"] = "The window must end after it starts."
        elif ends_at <= now:
            errors["ends_at"] = "The window is already over."
        elif ends_at - starts_at > MAX_MAINTENANCE:
            errors["ends_at"] = "A window lasts at most 14 days; unlist the machine instead."
        elif starts_at > now + MAINTENANCE_HORIZON:
            errors["starts_at"] = "At most a year ahead."
    note = (note or "").strip()
    if (problem := name_problem(note, max_length=200, required=False)) is not None:
        errors["note"] = problem
    if not errors:
        clash = MaintenanceWindow.objects.filter(
            machine=machine, starts_at__lt=ends_at, ends_at__gt=starts_at
        ).first()
        if clash is not None:
            errors["starts_at"] = f"It overlaps the window {clash}."
    if errors:
        raise ValidationError(errors)
    window = MaintenanceWindow.objects.create(
        machine=machine, starts_at=max(starts_at, now), ends_at=ends_at, note=note
    )
    record_event(
        machine,
        "maintenance",
        f"Maintenance {window.starts_at:%Y-%m-%d %H:%M}–{window.ends_at:%Y-%m-%d %H:%M} UTC"
        + (f": {note}" if note else ""),
    )
    notify_changed(machine, "maintenance")
    return window


@transaction.atomic
def maintenance_window_remove(*, machine_id: int, window_id: int) -> None:
    """Cancel a window of this machine (a window id of another machine changes nothing)."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    window = MaintenanceWindow.objects.filter(machine=machine, pk=window_id).first()
    if window is None:
        raise ValidationError({"window": "No such maintenance window on this machine."})
    window.delete()
    record_event(machine, "maintenance", f"Maintenance {window} cancelled")
    notify_changed(machine, "maintenance")
