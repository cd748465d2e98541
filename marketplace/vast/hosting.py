"""The vast.ai-compatible endpoints for providers (``show machines``, ``list machine``,
``unlist machine``, ``schedule maint``, ``show earnings``): vast's paths and shapes over the
hosts room's services, for keys with the provider audience; another team's machine answers
404 as in /api/v1/.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from billing.selectors import earnings_by_day, earnings_by_machine
from hosts.models import Machine
from hosts.services import machine_set_listed, machine_set_terms, maintenance_window_add
from marketplace.models.rentals import all_free_offers
from marketplace.tenancy import team_objects
from marketplace.vast import shapes
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, VastView


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
