"""The console's view of an offer's measured figures, before renting (the same data as
``/api/v1/offers/<id>/figures/``), and the charts the machine page shares with it."""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from hosts.models import BenchmarkRun, ReliabilityRecord
from hosts.selectors import benchmark_history, reliability_history
from hosts.services import RELIABILITY_WINDOW
from marketplace.api.offer_figures import listed_machine
from marketplace.charts import FigurePoint
from marketplace.models import Offer


def dlperf_points(runs: Sequence[BenchmarkRun]) -> list[FigurePoint]:
    """dlperf per GPU of each run; a failed run is drawn as a failure."""
    points = []
    for run in runs:
        simulated = " (GPU figures simulated)" if run.gpu_simulated else ""
        title = (
            f"{run.measured_at:%Y-%m-%d %H:%M}: dlperf {run.dlperf_per_gpu:g} per GPU{simulated}"
            if run.passed and run.dlperf_per_gpu is not None
            else f"{run.measured_at:%Y-%m-%d %H:%M}: failed: {run.reason}"
        )
        value = run.dlperf_per_gpu if run.passed else None
        points.append(FigurePoint(f"{run.measured_at:%m-%d}", value, title))
    return points


def reliability_points(records: Sequence[ReliabilityRecord]) -> list[FigurePoint]:
    return [
        FigurePoint(
            f"{r.recorded_at:%m-%d %H}h",
            round(r.reliability * 100, 1),
            f"{r.recorded_at:%Y-%m-%d %H:%M}: {r.reliability:.1%}",
        )
        for r in records
    ]


def figures_context(machine) -> dict:
    runs = benchmark_history(machine)
    return {
        "bench_runs": runs[::-1][:10],  # newest first in the table
        "dlperf_points": dlperf_points(runs),
        "reliability_points": reliability_points(reliability_history(machine)),
        "reliability_days": RELIABILITY_WINDOW.days,
    }


@login_required
def offer_figures(request: HttpRequest, machine_id: int) -> HttpResponse:
    machine = listed_machine(machine_id)
    context = {
        "machine": machine,
        "offer": Offer.objects.filter(machine=machine, all_free=True).first(),
        **figures_context(machine),
    }
    return render(request, "marketplace/offer_figures.html", context)
