"""Provider console: machines, adding one over SSH, confirming its key, terms, listing, health."""

from __future__ import annotations

from datetime import datetime, time

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.errors import InvalidAmount
from billing.money import parse_usd
from hosts import services, tasks
from hosts.keys import platform_public_key
from hosts.models import Machine
from hosts.selectors import gpu_occupancy, heartbeat_series
from marketplace.models import Role
from marketplace.tenancy import team_object_or_404, team_objects


def _require(request: HttpRequest, role: Role) -> None:
    if not request.membership.allows(role):
        raise PermissionDenied(f"This needs the {role.label.lower()} role in the team.")


def _errors(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return " ".join(
            f"{k.replace('_', ' ')}: {' '.join(v)}" for k, v in error.message_dict.items()
        )
    return " ".join(error.messages)


@login_required
def machines(request: HttpRequest) -> HttpResponse:
    found = list(team_objects(request.team, Machine.objects.all()))
    grid = gpu_occupancy(found)
    rows = [(m, grid[m.pk]) for m in found]
    totals = {
        "machines": len(found),
        "online": sum(m.status == "online" for m in found),
        "gpus": sum(len(cells) for cells in grid.values()),
        "rented": sum(state == "rented" for cells in grid.values() for _, state in cells),
    }
    return render(request, "hosts/machines.html", {"rows": rows, "totals": totals})


@login_required
def machine_add(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        _require(request, Role.ADMIN)
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
            messages.error(request, _errors(error))
        else:
            transaction.on_commit(lambda: tasks.machine_connect.delay(machine.pk))
            messages.success(request, "Connecting to read the machine's host key…")
            return redirect("machine-detail", pk=machine.pk)
    return render(
        request,
        "hosts/machine_add.html",
        {"public_key": platform_public_key(), "values": request.POST},
    )


@login_required
def machine_detail(request: HttpRequest, pk: int) -> HttpResponse:
    machine = team_object_or_404(request.team, Machine.objects.all(), pk=pk)
    cells = gpu_occupancy([machine])[machine.pk]
    series = heartbeat_series(machine)
    context = {
        "machine": machine,
        "cells": cells,
        "events": machine.events.all()[:40],
        "series": series,
        "chart": _uptime_chart(series),
        "windows": machine.maintenance_windows.filter(ends_at__gt=timezone.now()),
        "public_key": platform_public_key(),
        "can_admin": request.membership.allows(Role.ADMIN),
        "price": machine.price_per_gpu_hour / 1_000_000,
        "storage_price": machine.storage_price_per_gb_month / 1_000_000,
    }
    return render(request, "hosts/machine_detail.html", context)


def _uptime_chart(series: list[tuple[str, float, int]]) -> dict[str, object]:
    """Bars of the share of heartbeats answered per hour, as SVG coordinates."""
    width, height = 560, 120
    if not series:
        return {"bars": [], "width": width, "height": height}
    step = width / len(series)
    bars = []
    for i, (label, share, total) in enumerate(series):
        bar_height = max(share * (height - 20), 2)
        bars.append({
            "x": round(i * step + 2, 1), "y": round(height - 16 - bar_height, 1), "w": round(max(step - 4, 2), 1),
            "h": round(bar_height, 1), "label": label, "share": round(share * 100), "total": total,
            "bad": share < 0.99, "show_label": i % max(len(series) // 6, 1) == 0,
        })  # fmt: skip
    return {"bars": bars, "width": width, "height": height}


@login_required
@require_POST
def machine_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    _require(request, Role.ADMIN)
    machine = team_object_or_404(request.team, Machine.objects.all(), pk=pk)
    try:
        if action == "confirm":
            services.machine_confirm_host_key(
                machine_id=machine.pk, fingerprint=request.POST.get("fingerprint", "")
            )
            transaction.on_commit(lambda: tasks.machine_probe.delay(machine.pk))
            messages.success(request, "Host key pinned. Probing the machine…")
        elif action == "reconnect":
            tasks.machine_connect.delay(machine.pk)
            messages.info(request, "Reading the host key again.")
        elif action == "probe":
            tasks.machine_probe.delay(machine.pk)
            messages.info(request, "Probing…")
        elif action == "terms":
            services.machine_set_terms(
                machine_id=machine.pk,
                price_per_gpu_hour=parse_usd(
                    request.POST.get("price", ""), field="price_per_gpu_hour"
                ),
                storage_price_per_gb_month=parse_usd(
                    request.POST.get("storage_price", ""), field="storage_price_per_gb_month"
                ),
                min_gpus=int(request.POST.get("min_gpus") or 1),
                end_date=_end_date(request.POST.get("end_date", "")),
                location=request.POST.get("location", ""),
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
        messages.error(request, _errors(error))
    except InvalidAmount as error:
        messages.error(request, str(error))
    except ValueError:
        messages.error(request, "Minimum GPUs must be a whole number.")
    return redirect("machine-detail", pk=machine.pk)


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
