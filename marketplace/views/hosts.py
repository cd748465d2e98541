"""Provider console: machines, adding one over SSH, confirming its key, terms, listing, health."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.selectors import EarningsRow
from hosts import services, tasks
from hosts.countries import COUNTRY_CHOICES
from hosts.keys import team_public_key
from hosts.models import Machine, MachineStatus
from hosts.selectors import gpu_occupancy, hourly_history
from marketplace.fleet import EARNINGS_DAYS, fleet_summary, machine_earnings_by_day
from marketplace.forms.hosts import (
    HostKeyConfirmForm,
    MachineAddForm,
    MachineFirewallForm,
    MachineSharingForm,
    MachineTermsForm,
    MaintenanceCancelForm,
    MaintenanceWindowForm,
)
from marketplace.host_usage import machine_gpu_usage, machine_port_usage
from marketplace.models import Role
from marketplace.tenancy import team_object_or_404, team_objects
from marketplace.views.console import error_text, require_role
from marketplace.views.offer_figures import figures_context
from scheduler import services as scheduler

if TYPE_CHECKING:
    from celery import Task


@login_required
def machines(request: HttpRequest) -> HttpResponse:
    found = list(team_objects(request.team, Machine.objects.all()))
    grid = gpu_occupancy(found)
    fleet = fleet_summary(request.team, found, grid)
    rows = [(m, grid[m.pk], fleet.earnings_by_machine[m.pk]) for m in found]
    statuses = [
        (status.value, status.label, fleet.by_status[status.value])
        for status in MachineStatus
        if fleet.by_status[status.value]
    ]
    return render(
        request,
        "hosts/machines.html",
        {
            "rows": rows,
            "fleet": fleet,
            "statuses": statuses,
            "can_admin": request.membership.allows(Role.ADMIN),
        },
    )


@login_required
def machine_add(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        require_role(request, Role.ADMIN)
        try:
            machine = services.machine_register(
                team_id=request.team.pk, **MachineAddForm(request.POST).parsed()
            )
        except ValidationError as error:
            messages.error(request, error_text(error))
        else:
            transaction.on_commit(lambda: tasks.machine_connect.delay(machine.pk))
            messages.success(request, "Connecting to read the machine's host key…")
            return redirect("machine-detail", pk=machine.pk)
    return render(
        request,
        "hosts/machine_add.html",
        {"public_key": team_public_key(request.team.pk), "values": request.POST},
    )


@login_required
def machine_detail(request: HttpRequest, pk: int) -> HttpResponse:
    machine = team_object_or_404(request.team, Machine.objects.all(), pk=pk)
    return render(request, "hosts/machine_detail.html", _detail_context(request, machine))


def _detail_context(request: HttpRequest, machine: Machine) -> dict:
    cells = gpu_occupancy([machine])[machine.pk]
    history = hourly_history(machine)
    earnings = machine_earnings_by_day(request.team, machine)
    now = timezone.now()
    return {
        "machine": machine,
        "cells": cells,
        "slices": machine_slices(machine),
        "rented": sum(state == "rented" for _, state in cells),
        "unit_memory_gb": machine.unit_memory_mb / 1024,
        "events": machine.events.all()[:40],
        "history": history,
        "earnings": earnings,
        "earnings_days": EARNINGS_DAYS,
        "earnings_total": EarningsRow(
            "total",
            sum(r.gross for r in earnings),
            sum(r.fee for r in earnings),
            sum(r.net for r in earnings),
        ),
        "windows": machine.maintenance_windows.filter(ends_at__gt=now),
        "in_maintenance": machine.maintenance_windows.filter(
            starts_at__lte=now, ends_at__gt=now
        ).exists(),
        "public_key": team_public_key(machine.team_id),
        "can_admin": request.membership.allows(Role.ADMIN),
        "terms": machine_terms(machine),
        "terms_errors": {},
        "countries": COUNTRY_CHOICES,
        "heartbeat_seconds": services.heartbeat_seconds(),
        "heartbeat_misses": services.heartbeat_misses_allowed(),
        "offline_bound": services.offline_bound_seconds(),
        "reliability_days": services.RELIABILITY_WINDOW.days,
        **figures_context(machine),
    }


TERMS_FIELDS = (
    "price", "storage_price", "min_gpus", "min_bid", "location", "end_date",
    "port_range_start", "port_range_end",
)  # fmt: skip
# The service's names for the terms form's fields, where they differ.
TERMS_FIELD_OF = {
    "price_per_gpu_hour": "price",
    "storage_price_per_gb_month": "storage_price",
    "min_bid_price_per_gpu_hour": "min_bid",
}


def machine_terms(machine: Machine) -> dict[str, str]:
    """The terms form's values as the machine has them."""
    floor = machine.min_bid_price_per_gpu_hour
    return {
        "price": _dollars(machine.price_per_gpu_hour),
        "storage_price": _dollars(machine.storage_price_per_gb_month),
        "min_gpus": str(machine.min_gpus),
        "min_bid": "" if floor is None else _dollars(floor),
        "location": machine.location,
        "end_date": f"{machine.end_date:%Y-%m-%d}" if machine.end_date else "",
        "port_range_start": str(machine.port_range_start),
        "port_range_end": str(machine.port_range_end),
    }


def machine_slices(machine: Machine) -> list[dict]:
    """Each card that slices hold now: its index, the slices' compute and memory in use (the
    provider sees how full each shared card is; whose slices they are is the renters' own)."""
    rows = (
        scheduler.live_gpu_slices()
        .filter(gpu__machine=machine)
        .values("gpu__index", "gpu__memory_mib")
        .annotate(slices=Count("pk"), core=Sum("core_percent"), memory=Sum("memory_mb"))
        .order_by("gpu__index")
    )
    return [
        {
            "index": row["gpu__index"],
            "slices": row["slices"],
            "core": row["core"],
            "memory": row["memory"],
            "card_memory": row["gpu__memory_mib"],
        }
        for row in rows
    ]


# --- machine actions: one handler per button of the machine page ----------------------------
# A handler parses its form, calls the service and says what happened; it returns a response
# only when the page to show next is not the machine's own.

MachineAction = Callable[[HttpRequest, Machine], HttpResponse | None]


def _when_committed(task: Task, machine: Machine) -> None:
    """Queue ``task`` for the machine once this request's writes are committed, so the
    worker reads them."""
    transaction.on_commit(lambda: task.delay(machine.pk))


def pin_host_key(request: HttpRequest, machine: Machine) -> None:
    fingerprint = HostKeyConfirmForm(request.POST).parsed()["fingerprint"]
    services.machine_confirm_host_key(machine_id=machine.pk, fingerprint=fingerprint)
    _when_committed(tasks.machine_probe, machine)
    messages.success(request, "Host key pinned. Probing the machine…")


def read_host_key_again(request: HttpRequest, machine: Machine) -> None:
    _when_committed(tasks.machine_connect, machine)
    messages.info(request, "Reading the host key again.")


def probe_again(request: HttpRequest, machine: Machine) -> None:
    _when_committed(tasks.machine_probe, machine)
    messages.info(request, "Probing… the figures below update when it is done.")


def run_self_test(request: HttpRequest, machine: Machine) -> None:
    _when_committed(tasks.machine_self_test, machine)
    messages.info(request, "Self-test started: probe, test container, limits.")


def plan_maintenance(request: HttpRequest, machine: Machine) -> None:
    window = MaintenanceWindowForm(request.POST).parsed()
    services.maintenance_window_add(machine_id=machine.pk, **window)
    messages.success(request, "Maintenance window added: no new rental will overlap it.")


def cancel_maintenance(request: HttpRequest, machine: Machine) -> None:
    window_id = MaintenanceCancelForm(request.POST).parsed()["window"]
    services.maintenance_window_remove(machine_id=machine.pk, window_id=window_id)
    messages.success(request, "Maintenance window cancelled.")


def remove_machine(request: HttpRequest, machine: Machine) -> HttpResponse:
    services.machine_remove(machine_id=machine.pk)
    messages.success(request, f"{machine.name} removed.")
    return redirect("machines")


def _dollars(micro: int) -> str:
    """Micro-dollars as the dollars a form field shows, exactly: 1234567 → "1.234567"."""
    return f"{Decimal(micro).scaleb(-6).normalize():f}"


def save_terms(request: HttpRequest, machine: Machine) -> HttpResponse | None:
    try:
        terms = MachineTermsForm(request.POST).parsed()
        services.machine_set_terms(
            machine_id=machine.pk,
            price_per_gpu_hour=terms["price"],
            storage_price_per_gb_month=terms["storage_price"],
            min_gpus=terms["min_gpus"],
            end_date=terms["end_date"],
            location=terms["location"],
            port_range_start=terms["port_range_start"],
            port_range_end=terms["port_range_end"],
            min_bid_price_per_gpu_hour=terms["min_bid"],
        )
    except ValidationError as error:
        return _terms_refused(request, machine, error)
    messages.success(request, "Terms saved. They apply to new rentals.")
    return None


def _terms_refused(request: HttpRequest, machine: Machine, error: ValidationError) -> HttpResponse:
    """The page again with the terms as typed and each refusal beside its field: a redirect
    would show the saved terms and lose everything typed. Nothing was saved."""
    machine.refresh_from_db()
    context = _detail_context(request, machine)
    context["terms"] = {name: request.POST.get(name, "") for name in TERMS_FIELDS}
    context["terms_errors"] = {
        TERMS_FIELD_OF.get(field, field): " ".join(reasons)
        for field, reasons in getattr(error, "message_dict", {"": error.messages}).items()
    }
    messages.error(request, error_text(error))
    return render(request, "hosts/machine_detail.html", context, status=400)


def set_blocked_ranges(request: HttpRequest, machine: Machine) -> None:
    ranges = MachineFirewallForm(request.POST).parsed()["blocked_ranges"]
    services.machine_set_blocked_ranges(machine_id=machine.pk, ranges=ranges)
    _when_committed(tasks.machine_probe, machine)  # the probe sets the host's rules up
    messages.success(request, "Saved. The machine's firewall follows at the probe now running.")


def set_sharing(request: HttpRequest, machine: Machine) -> None:
    sharing = MachineSharingForm(request.POST).parsed()
    scheduler.machine_sharing_set(
        machine_id=machine.pk,
        enabled=sharing["enabled"],
        min_core_percent=sharing["min_core_percent"],
    )
    _when_committed(tasks.machine_mps_follow, machine)
    messages.success(
        request,
        "GPU sharing on: renters can rent slices of the cards no whole rental holds."
        if sharing["enabled"]
        else "GPU sharing off: whole GPUs only.",
    )


def list_machine(request: HttpRequest, machine: Machine) -> None:
    services.machine_set_listed(machine_id=machine.pk, listed=True)
    messages.success(request, "Listed: renters can find it now.")


def unlist_machine(request: HttpRequest, machine: Machine) -> None:
    services.machine_set_listed(machine_id=machine.pk, listed=False)
    messages.success(request, "Unlisted. Running rentals continue.")


MACHINE_ACTIONS: dict[str, MachineAction] = {
    "confirm": pin_host_key,
    "reconnect": read_host_key_again,
    "probe": probe_again,
    "self-test": run_self_test,
    "maintenance": plan_maintenance,
    "maintenance-cancel": cancel_maintenance,
    "remove": remove_machine,
    "terms": save_terms,
    "sharing": set_sharing,
    "firewall": set_blocked_ranges,
    "list": list_machine,
    "unlist": unlist_machine,
}


@login_required
@require_POST
def machine_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    require_role(request, Role.ADMIN)
    machine = team_object_or_404(request.team, Machine.objects.all(), pk=pk)
    handler = MACHINE_ACTIONS.get(action)
    if handler is None:
        messages.error(request, "Unknown action.")
        return redirect("machine-detail", pk=machine.pk)
    try:
        response = handler(request, machine)
    except ValidationError as error:
        messages.error(request, error_text(error))
        response = None
    return response or redirect("machine-detail", pk=machine.pk)


@login_required
def machine_usage(request: HttpRequest, pk: int) -> HttpResponse:
    """The machine page's usage card (loaded after the page: it reads nvidia-smi now)."""
    machine = team_object_or_404(request.team, Machine.objects.all(), pk=pk)
    return render(
        request,
        "hosts/_machine_usage.html",
        {
            "machine": machine,
            "gpu_usage": machine_gpu_usage(machine, viewer_team_id=request.team.pk),
            "port_usage": machine_port_usage(machine, viewer_team_id=request.team.pk),
        },
    )


urlpatterns = [
    path("machines/", machines, name="machines"),
    path("machines/add/", machine_add, name="machine-add"),
    path("machines/<id:pk>/", machine_detail, name="machine-detail"),
    path("machines/<id:pk>/usage/", machine_usage, name="machine-usage"),
    path("machines/<id:pk>/<str:action>/", machine_action, name="machine-action"),
]
