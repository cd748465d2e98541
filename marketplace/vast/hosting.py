"""The vast.ai-compatible endpoints for providers (``show machines``, ``show machine``,
``list machine``, ``unlist machine``, ``schedule/show/cancel maint``, ``set min-bid``,
``delete machine``, ``reports``, ``show earnings``): vast's paths and shapes over the
hosts room's services, for keys with the provider audience; another team's machine answers
404 as in /api/v1/.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from billing.selectors import earnings_by_day, earnings_by_machine
from hosts.models import Machine, MaintenanceWindow
from hosts.services import (
    machine_remove,
    machine_set_listed,
    machine_set_terms,
    maintenance_window_add,
    maintenance_window_remove,
)
from marketplace.models.rentals import all_free_offers
from marketplace.tenancy import team_objects
from marketplace.vast import shapes
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, VastView, json_param


class ProviderView(VastView):
    audience = "provider"

    def machine(self, pk: Any) -> Machine:
        """The team's machine, or vast's 404 (another team's id included)."""
        found = None
        if isinstance(pk, int) and not isinstance(pk, bool):
            found = team_objects(self.team, Machine.objects.all()).filter(pk=pk).first()
        if found is None:
            raise NotFound(f"Machine {pk} is not one of your team's machines.")
        return found


class Machines(ProviderView):
    """``vastai show machines``: the team's machines with their listing."""

    @extend_schema(summary="vast.ai: show machines", responses={200: ANY_JSON})
    def get(self, request):
        machines = team_objects(
            self.team, Machine.objects.prefetch_related(all_free_offers()).order_by("pk")
        )
        return Response({"machines": [shapes.machine_row(machine) for machine in machines]})


class CreateAsks(ProviderView):
    """``vastai list machine <id> -g <price> -s <storage price> -e <end date> -m <min gpus>``:
    set the listing terms and list, both or neither. A price left out keeps the current one."""

    @extend_schema(
        summary="vast.ai: list machine",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request):
        body = self.body()
        machine = self.machine(body.get("machine"))
        terms = shapes.listing_terms(body, machine)
        with transaction.atomic():  # terms without the listing would be half of what was asked
            machine_set_terms(machine_id=machine.pk, **terms)
            machine_set_listed(machine_id=machine.pk, listed=True)
        return Response({"success": True, "extended": 0})


class MachineAsks(ProviderView):
    """``vastai unlist machine <id>``: no new rentals; running ones go on."""

    @extend_schema(summary="vast.ai: unlist machine", responses={200: ANY_JSON})
    def delete(self, request, pk: int):
        machine_set_listed(machine_id=self.machine(pk).pk, listed=False)
        return Response({"success": True})


class MachineMaintenance(ProviderView):
    """``vastai schedule maint <id> --sdate <epoch> --duration <hours>``: a maintenance window
    no new rental may overlap (running rentals are not touched)."""

    @extend_schema(
        summary="vast.ai: schedule maint",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, pk: int):
        machine = self.machine(pk)
        starts_at, ends_at = shapes.maintenance_window(self.body())
        category = self.body().get("maintenance_category") or ""
        window = maintenance_window_add(
            machine_id=machine.pk,
            starts_at=starts_at,
            ends_at=ends_at,
            note="" if category == "not provided" else str(category)[:200],
        )
        return Response({"success": True, "id": window.pk})


class MachineEarnings(ProviderView):
    """``vastai show earnings``: the team's provider earnings (gross, platform fee, net in
    dollars) per machine and per day; the CLI prints them as JSON."""

    @extend_schema(summary="vast.ai: show earnings", responses={200: ANY_JSON})
    def get(self, request):
        from billing.models import Entry

        since = day_param(request, "sday")
        until = day_param(request, "eday")
        entries = team_objects(self.team, Entry.objects.all())
        first_day = datetime.fromtimestamp(since * 86400, UTC).date() if since else None
        if until is not None:
            entries = entries.filter(
                created_at__lt=datetime.fromtimestamp((math.floor(until) + 1) * 86400, UTC)
            )
        machine_id = request.query_params.get("machid")
        per_machine = earnings_by_machine(entries, since=first_day)
        if machine_id not in (None, "", "null", "None"):
            per_machine = [row for row in per_machine if row.key == f"machine:{machine_id}"]
        per_day = earnings_by_day(entries, since=first_day)
        return Response(
            {
                "summary": shapes.earnings_row("total", per_machine),
                "per_machine": [shapes.earnings_row(row.key, [row]) for row in per_machine],
                "per_day": [shapes.earnings_row(str(row.key), [row]) for row in per_day],
            }
        )


def day_param(request, name: str) -> float | None:
    """A day number (days since 1970, fractional), as the CLI sends its dates for earnings."""
    raw = request.query_params.get(name)
    if raw in (None, "", "null"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise Refused(f"{name} is a number of days since 1970.", field=name) from None
    if not 0 <= value <= 2_900_000:  # up to the year 9900; past it there is no date
        raise Refused(f"{name} is a number of days since 1970.", field=name)
    return value


# --- one machine, its maintenance, its minimum bid ---------------------------------------------


class MachineDetail(ProviderView):
    """``vastai show machine <id>``: the machine as ``show machines`` shows it, in a list (the
    CLI reads one)."""

    @extend_schema(summary="vast.ai: show machine", responses={200: ANY_JSON})
    def get(self, request, pk: int):
        return Response([shapes.machine_row(self.machine(int(pk)))])


class Maintenances(ProviderView):
    """``vastai show maints -i <id,id…>``: the machines' maintenance windows still to come or
    under way."""

    @extend_schema(summary="vast.ai: show maints", responses={200: ANY_JSON})
    def get(self, request):
        ids = json_param(request, "machine_ids")
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise Refused("machine_ids is a list of machine ids.", field="machine_ids")
        machines = [self.machine(pk) for pk in dict.fromkeys(ids)]
        windows = MaintenanceWindow.objects.filter(
            machine__in=machines, ends_at__gt=timezone.now()
        ).order_by("starts_at", "pk")
        return Response([shapes.maintenance_row(window) for window in windows])


class MachineCancelMaintenance(ProviderView):
    """``vastai cancel maint <id>``: the machine's maintenance windows still to come or under
    way are cancelled; new rentals may overlap those times again."""

    @extend_schema(
        summary="vast.ai: cancel maint",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, pk: int):
        machine = self.machine(pk)
        windows = machine.maintenance_windows.filter(ends_at__gt=timezone.now())
        with transaction.atomic():
            for window_id in windows.values_list("pk", flat=True):
                maintenance_window_remove(machine_id=machine.pk, window_id=window_id)
        return Response({"success": True})


class MachineMinBid(ProviderView):
    """``vastai set min-bid <id> --price P``: the lowest bid per GPU-hour the machine takes
    for interruptible rentals; its other terms stay."""

    @extend_schema(
        summary="vast.ai: set min-bid",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, pk: int):
        machine = self.machine(pk)
        price = self.body().get("price")
        if price is None:
            raise Refused("--price: the lowest bid per GPU-hour, like 0.2.", field="price")
        terms = shapes.listing_terms({"price_min_bid": price}, machine)
        machine_set_terms(machine_id=machine.pk, **terms)
        return Response({"success": True})


class MachineForceDelete(ProviderView):
    """``vastai delete machine <id>``: removes a machine that was never rented. One with
    rentals on record keeps its history and stays (unlist it instead): nothing is forced."""

    @extend_schema(summary="vast.ai: delete machine", responses={200: ANY_JSON})
    def post(self, request, pk: int):
        machine_remove(machine_id=self.machine(pk).pk)
        return Response({"success": True})


class MachineReports(ProviderView):
    """``vastai reports <id>``: renters' reports on the machine. Renters here file none (a
    problem goes to the platform's operators), so the list is empty."""

    @extend_schema(summary="vast.ai: reports", responses={200: ANY_JSON})
    def get(self, request, pk: int):
        self.machine(pk)
        return Response([])
