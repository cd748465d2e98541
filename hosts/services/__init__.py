"""Writes of the hosts room: register a machine, pin its key, probe it, list it, watch it.

One module per concept: ``registration`` (address, host key, removal), ``probing``,
``listing`` (terms and commitments), ``heartbeats`` (and reliability), ``maintenance``,
``selftest``; ``events`` records a machine's history and status for all of them. Callers
import from ``hosts.services``; the names below are the room's public writes and knobs.

SSH happens outside transactions (a slow machine must not hold row locks); each write after
it is a short transaction that re-reads the row.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError

from hosts.services.heartbeats import (
    HEARTBEAT_COMMAND_TIMEOUT,
    RELIABILITY_WINDOW,
    heartbeat_misses_allowed,
    heartbeat_seconds,
    heartbeats_prune,
    machine_container_killed,
    machine_heartbeat,
    machine_reliability,
    offline_bound_seconds,
    reliability_figures,
)
from hosts.services.listing import (
    MAX_PRICE_PER_GPU_HOUR,
    MAX_STORAGE_PRICE,
    committed_until,
    machine_set_blocked_ranges,
    machine_set_listed,
    machine_set_terms,
    register_commitments,
)
from hosts.services.maintenance import (
    MAINTENANCE_HORIZON,
    MAX_MAINTENANCE,
    maintenance_window_add,
    maintenance_window_remove,
)
from hosts.services.probing import (
    PROBED_FIGURES,
    machine_apply_probe,
    machine_probe,
    machine_probe_due,
    probe_failures_allowed,
    probe_retry_seconds,
)
from hosts.services.registration import (
    FIRST_CONTACT_GRACE,
    flag_key_mismatch_handler,
    machine_confirm_host_key,
    machine_fetch_host_key,
    machine_flag_key_mismatch,
    machine_register,
    machine_remove,
    machines_never_reached,
)
from hosts.services.selftest import machine_self_test

__all__ = [
    "FIRST_CONTACT_GRACE",
    "HEARTBEAT_COMMAND_TIMEOUT",
    "MAINTENANCE_HORIZON",
    "MAX_MAINTENANCE",
    "MAX_PRICE_PER_GPU_HOUR",
    "MAX_STORAGE_PRICE",
    "PROBED_FIGURES",
    "RELIABILITY_WINDOW",
    "ValidationError",
    "committed_until",
    "flag_key_mismatch_handler",
    "heartbeat_misses_allowed",
    "heartbeat_seconds",
    "heartbeats_prune",
    "machine_apply_probe",
    "machine_confirm_host_key",
    "machine_fetch_host_key",
    "machine_flag_key_mismatch",
    "machine_container_killed",
    "machine_heartbeat",
    "machine_probe",
    "machine_probe_due",
    "machine_register",
    "machine_reliability",
    "machine_remove",
    "machine_self_test",
    "machine_set_blocked_ranges",
    "machine_set_listed",
    "machine_set_terms",
    "maintenance_window_add",
    "maintenance_window_remove",
    "machines_never_reached",
    "offline_bound_seconds",
    "probe_failures_allowed",
    "probe_retry_seconds",
    "register_commitments",
    "reliability_figures",
]
