"""A machine out of service: what its containers do cannot be known until its host answers.

Its running and paused instances become ``unknown``: they keep their GPUs (the containers
may still run on them), their GPU time is not charged, and reconcile says what became of each
once the host answers again (``reconcile._resolve_unknown``). Nothing is destroyed for the
outage alone.
"""

from __future__ import annotations

from scheduler.models import Instance, InstanceState
from scheduler.services.transitions import instance_transition

# What an outage makes unknown. A launch, stop or destroy under way is its worker's to finish
# (it retries until the host answers); an exited or stopped container stays as it was seen.
OUTAGE_STATES = {InstanceState.RUNNING, InstanceState.PAUSED}


def machine_instances_unknown(*, machine_id: int, reason: str) -> int:
    """Mark the machine's running and paused instances unknown, saying why; how many."""
    moved = 0
    ids = Instance.objects.filter(machine_id=machine_id, state__in=OUTAGE_STATES).values_list(
        "pk", flat=True
    )
    for instance_id in list(ids):
        moved += (
            instance_transition(
                instance_id=instance_id,
                to_state=InstanceState.UNKNOWN,
                reason=f"Its host cannot say whether the container runs: {reason}"[:500],
                only_from=OUTAGE_STATES,
            )
            is not None
        )
    return moved
