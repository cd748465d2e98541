"""Provider console: machines, adding one over SSH, confirming its key, terms, listing, health."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, time

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.errors import InvalidAmount
from billing.money import format_usd, parse_usd
from billing.selectors import EarningsRow
from hosts import services, tasks
from hosts.keys import team_public_key
from hosts.models import Machine, MachineStatus
from hosts.selectors import HourPoint, gpu_occupancy, hourly_history
from marketplace.fleet import EARNINGS_DAYS, fleet_summary, machine_earnings_by_day
from marketplace.models import Role
from marketplace.tenancy import team_object_or_404, team_objects
from marketplace.views.console import error_text, require_role
from marketplace.views.numbers import form_whole


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
            port = int(request.POST.get("port") or 22)
        except ValueError:
            port = -1
        try:
            machine = services.machine_register(
                team_id=request.team.pk,
                name=request.POST.get("name", ""),
                address=request.POST.get("address", ""),
                port=port,
                ssh_user=request.POST.get("ssh_user", "root").strip(),
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
    cells = gpu_occupancy([machine])[machine.pk]
    history = hourly_history(machine)
    earnings = machine_earnings_by_day(request.team, machine)
    now = timezone.now()
    context = {
        "machine": machine,
        "cells": cells,
        "rented": sum(state == "rented" for _, state in cells),
        "unit_memory_gb": machine.unit_memory_mb / 1024,
        "events": machine.events.all()[:40],
        "uptime_chart": _bar_chart(history, lambda p: p.answered, bad_below=0.99),
        "utilization_chart": _bar_chart(history, lambda p: p.utilization),
        "earnings_chart": _earnings_chart(earnings),
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
        "price": machine.price_per_gpu_hour / 1_000_000,
        "storage_price": machine.storage_price_per_gb_month / 1_000_000,
        "heartbeat_seconds": services.heartbeat_seconds(),
        "heartbeat_misses": services.heartbeat_misses_allowed(),
        "offline_bound": services.offline_bound_seconds(),
        "reliability_days": services.RELIABILITY_WINDOW.days,
    }
    return render(request, "hosts/machine_detail.html", context)


def _bar_chart(
    points: list[HourPoint], value: Callable[[HourPoint], float], *, bad_below: float = -1.0
) -> dict[str, object]:
    """One bar per hour of ``value(point)`` (0..1), as SVG coordinates with 0/50/100% lines."""
    width, height, left, bottom = 560, 130, 34, 16
    plot_h = height - bottom - 6
    grid = [{"y": round(6 + plot_h * (1 - f), 1), "label": f"{int(f * 100)}%"} for f in (0, 0.5, 1)]
    if not points:
        return {"bars": [], "width": width, "height": height, "grid": grid, "left": left}
    step = (width - left) / len(points)
    bars = []
    for i, point in enumerate(points):
        share = min(max(value(point), 0.0), 1.0)
        bar_h = max(share * plot_h, 1.5)
        bars.append({
            "x": round(left + i * step + 1, 1), "y": round(6 + plot_h - bar_h, 1),
            "w": round(max(step - 2, 1.5), 1), "h": round(bar_h, 1), "label": point.label,
            "share": round(share * 100), "samples": point.samples, "gpus": point.gpus,
            "bad": share < bad_below, "show_label": i % max(len(points) // 6, 1) == 0,
        })  # fmt: skip
    return {"bars": bars, "width": width, "height": height, "grid": grid, "left": left}


def _earnings_chart(rows: list[EarningsRow]) -> dict[str, object]:
    """One bar per day of gross charges, its platform fee drawn as the bar's top part, in the
    utilization chart's style and coordinates; grid lines at $0, half and the top."""
    width, height, left, bottom = 560, 130, 44, 16
    plot_h = height - bottom - 6
    top = max([row.gross for row in rows] + [0])
    # A round top for the axis: the next "nice" figure above the largest day.
    scale = _nice_ceiling(top) if top else 1_000_000
    grid = [
        {"y": round(6 + plot_h * (1 - f), 1), "label": format_usd(int(scale * f))}
        for f in (0, 0.5, 1)
    ]
    chart: dict[str, object] = {"width": width, "height": height, "grid": grid, "left": left}
    if not top:
        chart["bars"] = []
        return chart
    step = (width - left) / len(rows)
    bars = []
    for i, row in enumerate(rows):
        gross_h = row.gross / scale * plot_h
        fee_h = row.fee / scale * plot_h
        x, w = round(left + i * step + 1, 1), round(max(step - 2, 1.5), 1)
        bars.append({
            "x": x, "w": w, "y": round(6 + plot_h - gross_h, 1), "h": round(gross_h, 1),
            "fee_h": round(fee_h, 1), "label": f"{row.key:%m-%d}", "gross": format_usd(row.gross),
            "fee": format_usd(row.fee), "net": format_usd(row.net), "empty": not row.gross,
            "show_label": i % max(len(rows) // 6, 1) == 0,
        })  # fmt: skip
    chart["bars"] = bars
    return chart


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 × 10^k micro-dollars at or above ``value``."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if factor * magnitude >= value:
                return factor * magnitude
        magnitude *= 10


@login_required
@require_POST
def machine_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    require_role(request, Role.ADMIN)
    machine = team_object_or_404(request.team, Machine.objects.all(), pk=pk)
    try:
        if action == "confirm":
            services.machine_confirm_host_key(
                machine_id=machine.pk, fingerprint=request.POST.get("fingerprint", "")
            )
            transaction.on_commit(lambda: tasks.machine_probe.delay(machine.pk))
            messages.success(request, "Host key pinned. Probing the machine…")
        elif action == "reconnect":
            transaction.on_commit(lambda: tasks.machine_connect.delay(machine.pk))
            messages.info(request, "Reading the host key again.")
        elif action == "probe":
            transaction.on_commit(lambda: tasks.machine_probe.delay(machine.pk))
            messages.info(request, "Probing… the figures below update when it is done.")
        elif action == "self-test":
            transaction.on_commit(lambda: tasks.machine_self_test.delay(machine.pk))
            messages.info(request, "Self-test started: probe, test container, limits.")
        elif action == "maintenance":
            services.maintenance_window_add(
                machine_id=machine.pk,
                starts_at=_moment(request.POST.get("starts_at", ""), "starts_at"),
                ends_at=_moment(request.POST.get("ends_at", ""), "ends_at"),
                note=request.POST.get("note", ""),
            )
            messages.success(request, "Maintenance window added: no new rental will overlap it.")
        elif action == "maintenance-cancel":
            try:
                window_id = int(request.POST.get("window", ""))
            except ValueError:
                raise ValidationError({"window": "No such maintenance window."}) from None
            services.maintenance_window_remove(machine_id=machine.pk, window_id=window_id)
            messages.success(request, "Maintenance window cancelled.")
        elif action == "remove":
            services.machine_remove(machine_id=machine.pk)
            messages.success(request, f"{machine.name} removed.")
            return redirect("machines")
        elif action == "terms":
            services.machine_set_terms(
                machine_id=machine.pk,
                price_per_gpu_hour=parse_usd(
                    request.POST.get("price", ""), field="price_per_gpu_hour"
                ),
                storage_price_per_gb_month=parse_usd(
                    request.POST.get("storage_price", ""), field="storage_price_per_gb_month"
                ),
                min_gpus=form_whole(request.POST.get("min_gpus") or "1", field="min_gpus"),
                end_date=_end_date(request.POST.get("end_date", "")),
                location=request.POST.get("location", ""),
                port_range_start=form_whole(
                    request.POST.get("port_range_start") or "0", field="port_range_start"
                ),
                port_range_end=form_whole(
                    request.POST.get("port_range_end") or "0", field="port_range_end"
                ),
            )
            messages.success(request, "Terms saved. They apply to new rentals.")
        elif action in ("list", "unlist"):
            services.machine_set_listed(machine_id=machine.pk, listed=action == "list")
            messages.success(
                request,
                "Listed: renters can find it now."
                if action == "list"
                else "Unlisted. Running rentals continue.",
            )
        else:
            messages.error(request, "Unknown action.")
    except ValidationError as error:
        messages.error(request, error_text(error))
    except InvalidAmount as error:
        messages.error(request, str(error))
    return redirect("machine-detail", pk=machine.pk)


def _moment(text: str, field: str) -> datetime:
    """A ``datetime-local`` input (the browser's local time is taken as UTC, and said so)."""
    try:
        moment = datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M")
    except ValueError:
        raise ValidationError({field: "Use a date and time like 2027-06-30 22:00."}) from None
    return moment.replace(tzinfo=UTC)


def _end_date(text: str) -> datetime | None:
    if not text:
        return None
    try:
        day = datetime.strptime(text, "%Y-%m-%d").date()
    except ValueError:
        raise ValidationError({"end_date": "Use a date like 2027-06-30."}) from None
    return timezone.make_aware(datetime.combine(day, time(23, 59)))


urlpatterns = [
    path("machines/", machines, name="machines"),
    path("machines/add/", machine_add, name="machine-add"),
    path("machines/<int:pk>/", machine_detail, name="machine-detail"),
    path("machines/<int:pk>/<str:action>/", machine_action, name="machine-action"),
]
