"""GPU sharing on a machine: the provider turns it on (its cards may then be sliced) or off.

Sharing needs CUDA MPS on the host, as the last probe found it; it is refused, saying why,
without. It cannot be turned off while slices run on the machine: their limits live in the MPS
daemon the machine would stop. Only cards no whole-GPU rental holds are sliced, and a sliced
card takes no whole-GPU rental until its slices are gone (``FreeCapacity``, and the card
triggers in the database).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from hosts.models import Machine
from hosts.services.events import notify_changed, record_event
from scheduler.services.allocations import live_gpu_slices

NO_MPS = (
    "This machine has no CUDA MPS: the last probe did not find nvidia-cuda-mps-control "
    "beside a working NVIDIA driver. Install the driver's MPS control daemon (it ships with "
    "the CUDA toolkit and the datacenter drivers), probe the machine again, then turn sharing on."
)


@transaction.atomic
def machine_sharing_set(*, machine_id: int, enabled: bool, min_core_percent: int) -> Machine:
    """Turn sharing on or off and set the smallest slice of a card's compute a renter may take.
    Raises ValidationError naming the field. The MPS daemon is started (or stopped) on commit
    by the caller's task."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    if not (1 <= min_core_percent <= 100):
        raise ValidationError({"min_core_percent": "Choose a whole percent from 1 to 100."})
    if enabled and not machine.mps_available:
        raise ValidationError({"enabled": NO_MPS})
    if not enabled and machine.sharing_enabled:
        running = live_gpu_slices().filter(gpu__machine_id=machine.pk).count()
        if running:
            raise ValidationError(
                {
                    "enabled": f"{running} slice(s) of this machine's GPUs are rented; sharing "
                    "can be turned off once they end (unlist the machine to stop new ones)."
                }
            )
    changed = (machine.sharing_enabled, machine.sharing_min_core_percent) != (
        enabled,
        min_core_percent,
    )
    machine.sharing_enabled = enabled
    machine.sharing_min_core_percent = min_core_percent
    machine.save(update_fields=["sharing_enabled", "sharing_min_core_percent"])
    if changed:
        record_event(
            machine,
            "sharing",
            f"GPU sharing on: slices from {min_core_percent}% of a card's compute"
            if enabled
            else "GPU sharing off: whole GPUs only",
        )
        notify_changed(machine, "sharing")
    return machine
