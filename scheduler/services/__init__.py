"""Writes of the scheduler: allocate GPUs and ports, move instances through their states, and
drive containers on the hosts (through hosts.runtime, over SSH). One module per concern; a
state's work lives in the module named for it (launch, stop_destroy, start, expiry, reconcile).

Callers import from here; the names below are the scheduler's public services.
"""

from __future__ import annotations

from scheduler.services.allocations import (
    LIVE_PORTS,
    CapacityTrial,
    FreeCapacity,
    allocation_release_all,
    allocations_write,
    gpu_allocation_reclaim,
    gpu_allocation_release,
    holding_gpus,
    instance_gpu_uuids,
    instance_holds_gpus,
    live_gpu_allocations,
    live_gpu_slices,
    machine_cards,
    sliced_gpu_ids,
    with_live_holdings,
)
from scheduler.services.container_spec import (
    JUPYTER_BOOTSTRAP,
    JUPYTER_CONTAINER_PORT,
    SSH_BOOTSTRAP,
    SSH_CONTAINER_PORT,
    container_spec_for,
)
from scheduler.services.errors import (
    InvalidTransition,
    LaunchInterrupted,
    LaunchModeUnavailable,
    NoCapacity,
    SchedulerError,
)
from scheduler.services.expiry import instance_expire
from scheduler.services.interruption import INTERRUPTIBLE_STATES, instance_interrupt
from scheduler.services.launch import instance_launch, instance_launch_fail
from scheduler.services.leased_work import WorkOutcome
from scheduler.services.outages import machine_instances_unknown
from scheduler.services.pause import instance_continue, instance_pause, instance_restart
from scheduler.services.reconcile import machine_reconcile, machines_needing_reconcile
from scheduler.services.sharing import machine_sharing_set
from scheduler.services.start import START_LEASE, instance_start, start_under_way
from scheduler.services.stop_destroy import (
    instance_destroy,
    instance_destroy_request,
    instance_stop,
    instance_stop_request,
)
from scheduler.services.transitions import instance_report_progress, instance_transition
from scheduler.services.versions import (
    instance_ports_set,
    instance_version_begin,
    instance_version_delete,
    instance_version_prepare,
    next_version_number,
    version_spec,
)

__all__ = [
    "INTERRUPTIBLE_STATES",
    "instance_interrupt",
    "JUPYTER_BOOTSTRAP",
    "JUPYTER_CONTAINER_PORT",
    "SSH_BOOTSTRAP",
    "SSH_CONTAINER_PORT",
    "START_LEASE",
    "InvalidTransition",
    "LaunchInterrupted",
    "LaunchModeUnavailable",
    "NoCapacity",
    "SchedulerError",
    "WorkOutcome",
    "CapacityTrial",
    "FreeCapacity",
    "allocation_release_all",
    "allocations_write",
    "container_spec_for",
    "gpu_allocation_reclaim",
    "gpu_allocation_release",
    "instance_continue",
    "instance_destroy",
    "instance_destroy_request",
    "instance_expire",
    "instance_gpu_uuids",
    "with_live_holdings",
    "LIVE_PORTS",
    "instance_launch",
    "instance_launch_fail",
    "instance_pause",
    "instance_report_progress",
    "instance_restart",
    "instance_start",
    "instance_stop",
    "instance_stop_request",
    "instance_transition",
    "instance_version_begin",
    "instance_version_delete",
    "instance_ports_set",
    "instance_version_prepare",
    "next_version_number",
    "version_spec",
    "live_gpu_allocations",
    "live_gpu_slices",
    "holding_gpus",
    "instance_holds_gpus",
    "machine_cards",
    "sliced_gpu_ids",
    "machine_reconcile",
    "machine_sharing_set",
    "machines_needing_reconcile",
    "machine_instances_unknown",
    "start_under_way",
]
