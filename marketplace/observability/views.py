"""The operator's page: the fleet's machines by state, launches that failed in the last hour
with their reasons, and the Celery queues. Staff only; anyone else, signed in or not, gets
404."""

from __future__ import annotations

from datetime import timedelta

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from hosts.models import Machine, MachineStatus
from marketplace.observability.gauges import counts_by, queue_lengths
from scheduler.models import InstanceEvent, InstanceState

FAILED_LAUNCHES_SHOWN = 100


def failed_launches(since: timedelta = timedelta(hours=1)):
    """Launches that ended failed since then, newest first, with the reason each gave."""
    return (
        InstanceEvent.objects.filter(
            to_state=InstanceState.FAILED,
            from_state=InstanceState.LAUNCHING,
            created_at__gte=timezone.now() - since,
        )
        .select_related("instance__machine", "instance__team")
        .order_by("-created_at", "-pk")[:FAILED_LAUNCHES_SHOWN]
    )


def machine_states() -> list[tuple[str, str, int]]:
    counts = counts_by(Machine.objects.all(), "status")
    return [(value, label, counts.get(value, 0)) for value, label in MachineStatus.choices]


def queue_depths() -> tuple[list[tuple[str, int]], str]:
    try:
        family = queue_lengths()
    except Exception as error:  # the broker is down: say so on the page
        return [], f"{type(error).__name__}: {error}"
    return [(sample.labels["queue"], int(sample.value)) for sample in family.samples], ""


def operator(request: HttpRequest) -> HttpResponse:
    # 404, not a log-in redirect: the page does not exist for anyone but staff.
    if not (request.user.is_authenticated and request.user.is_staff):
        raise Http404
    queues, queue_error = queue_depths()
    return render(
        request,
        "observability/operator.html",
        {
            "machine_states": machine_states(),
            "problem_machines": Machine.objects.filter(
                status__in=[
                    MachineStatus.OFFLINE,
                    MachineStatus.DEGRADED,
                    MachineStatus.KEY_MISMATCH,
                    MachineStatus.ERROR,
                ]
            )
            .select_related("team")
            .order_by("status", "name")[:100],
            "failed_launches": failed_launches(),
            "queues": queues,
            "queue_error": queue_error,
        },
    )
