"""The console's Overview page: where the team stands (marketplace/overview.py), kept live by
the team's events: each section is fetched again when an event that changes it arrives."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from marketplace.overview import SPEND_DAYS, team_overview


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    context = {"overview": team_overview(request.team), "spend_days": SPEND_DAYS}
    template = (
        "marketplace/_overview.html"
        if request.headers.get("HX-Request")
        else "marketplace/home.html"
    )
    return render(request, template, context)
