"""Launch, stop and destroy run holding the instance's lease (scheduler.work) and come to a
``WorkOutcome``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler import work as work_lease
from scheduler.models import Instance
from scheduler.signals import instance_progress


@dataclass(frozen=True)
class WorkOutcome:
    """What a launch, stop or destroy came to: the instance's state afterwards, or "busy"
    (another worker holds the lease: try again after ``retry_after`` seconds), "retry" (the
    host did not answer: try again after ``retry_after``) or "gone"."""

    instance_id: int
    state: str
    container_id: str = ""
    retry_after: float = 0


def leased(instance_id: int, state: str, work: Callable[[str], WorkOutcome]) -> WorkOutcome:
    """Run ``work(token)`` holding the instance's lease for ``state``, renewed all along."""
    token = work_lease.lease_claim(instance_id=instance_id, state=state)
    if token is None:
        current = Instance.objects.filter(pk=instance_id).values_list("state", flat=True).first()
        if current != state:
            return WorkOutcome(instance_id, current or "gone")
        return WorkOutcome(instance_id, "busy", retry_after=work_lease.lease_left(instance_id))
    outcome = None
    try:
        with work_lease.Heartbeat(instance_id, token):
            outcome = work(token)
        return outcome
    finally:
        retry_in = round(outcome.retry_after) if outcome and outcome.state == "retry" else None
        work_lease.lease_release(instance_id=instance_id, token=token, retry_in=retry_in)


def waiting_for_host(instance: Instance, what: str, error: Exception) -> WorkOutcome:
    """The host did not answer: say so on the instance and ask for a later try."""
    delay = work_lease.retry_delay(instance.attempts)
    message = (
        f"{what}: the host has not answered yet ({str(error)[:200]}); "
        f"try {instance.attempts}, the next in {delay} s"
    )
    Instance.objects.filter(pk=instance.pk, state=instance.state).update(
        status_message=message[:500]
    )
    instance_progress.send_robust(
        sender=Instance,
        instance_id=instance.pk,
        team_id=instance.team_id,
        progress=instance.progress,
        message=message,
    )
    return WorkOutcome(instance.pk, "retry", retry_after=delay)
