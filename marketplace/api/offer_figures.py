"""An offer's measured figures, for renters before they rent: the machine's verification
(with its reason), its benchmark runs (when each figure was measured, GPU figures marked when
simulated) and its reliability history. Public like the offers themselves, for listed
machines only."""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework.decorators import api_view
from rest_framework.response import Response

from hosts.models import BenchmarkRun, Machine
from hosts.selectors import benchmark_history, reliability_history
from hosts.services import RELIABILITY_WINDOW

BENCHMARK_COLUMNS = (
    "passed", "reason", "gpu_simulated", "gpu_count", "compute_cap", "tflops_per_gpu",
    "fp16_tflops_per_gpu", "gpu_mem_bw", "dlperf_per_gpu", "disk_write_mbps",
    "disk_read_mbps", "inet_up", "inet_down", "docker_start_ms",
)  # fmt: skip


def listed_machine(machine_id: int) -> Machine:
    """A machine whose figures the public may read: a listed one (404 otherwise)."""
    machine = Machine.objects.filter(pk=machine_id, listed=True).first()
    if machine is None:
        raise Http404("No such offer.")
    return machine


def benchmark_json(run: BenchmarkRun) -> dict:
    return {
        "measured_at": run.measured_at.isoformat(),
        **{c: getattr(run, c) for c in BENCHMARK_COLUMNS},
    }


def offer_figures_json(machine: Machine) -> dict:
    runs = benchmark_history(machine)
    return {
        "machine_id": machine.pk,
        "verified": machine.verified,
        "verification": machine.verification_detail,
        "verified_changed_at": machine.verified_changed_at.isoformat()
        if machine.verified_changed_at
        else None,
        "reliability": machine.reliability,
        "reliability_window_days": RELIABILITY_WINDOW.days,
        "benchmarks": [benchmark_json(run) for run in reversed(runs)],  # newest first
        "reliability_history": [
            {"recorded_at": r.recorded_at.isoformat(), "reliability": r.reliability}
            for r in reversed(reliability_history(machine))
        ],
    }


@extend_schema(
    summary="An offer's measured figures: verification, benchmark runs, reliability history",
    responses=OpenApiTypes.OBJECT,
)
@api_view(["GET"])
def offer_figures(request, machine_id: int):
    return Response(offer_figures_json(listed_machine(machine_id)))
