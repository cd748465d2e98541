"""The scheduler's domain errors; SchedulerError and its kinds answer 409."""

from __future__ import annotations


class SchedulerError(Exception):
    http_status = 409
    error_code = "conflict"


class NoCapacity(SchedulerError):
    """Not enough free GPUs or host ports on the machine (someone else took them)."""

    error_code = "gpus_taken"


class InvalidTransition(SchedulerError):
    error_code = "invalid_state"


class LaunchInterrupted(Exception):
    """The instance left launching (stopped, destroyed) while its launch was under way."""


class LaunchModeUnavailable(ValueError):
    """The image cannot serve the launch mode (no sshd, no jupyter)."""
