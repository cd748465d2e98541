"""The verified mark itself: the knobs (settings), how a verdict is applied (with its event),
reliability taking the mark away, and what a hardware change is. Shared by the verification
runs (``services``), the heartbeats and the probes, without importing either."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from hosts.models import Machine
from hosts.services.events import record_event
from hosts.verification.rules import Verdict

AUTO, REVOKED = "auto", "revoked"


def verify_every() -> timedelta:
    """How often a verified machine is measured again."""
    return timedelta(hours=float(getattr(settings, "HOST_VERIFY_EVERY_HOURS", 24)))


def verify_retry() -> timedelta:
    """How soon a machine whose run failed is tried again (it may have been a passing fault)."""
    return timedelta(minutes=float(getattr(settings, "HOST_VERIFY_RETRY_MINUTES", 30)))


def min_reliability() -> float:
    return float(getattr(settings, "HOST_VERIFY_MIN_RELIABILITY", 0.9))


def min_share_of_typical() -> float:
    """Measured GPU figures below this share of the model's typical ones fail verification."""
    return float(getattr(settings, "HOST_VERIFY_MIN_SHARE_OF_TYPICAL", 0.7))


def apply_verdict(machine: Machine, decided: Verdict, now) -> None:
    """Set the mark and its reason; an event when the mark changes. A mark an operator
    revoked stays revoked whatever a run finds (the run's finding is in its event)."""
    if machine.verification_override == REVOKED:
        return
    changed = machine.verified != decided.verified
    machine.verified = decided.verified
    machine.verification_detail = decided.reason[:500]
    if changed:
        machine.verified_changed_at = now
        record_event(
            machine,
            "verification",
            ("Verified: " if decided.verified else "No longer verified: ") + decided.reason,
        )
    machine.save(update_fields=["verified", "verification_detail", "verified_changed_at"])


def machine_reliability_judge(machine: Machine) -> None:
    """Inside the heartbeat's transaction: a verified machine whose reliability fell below
    the threshold loses the mark at once (the next passing run gives it back)."""
    if machine.verified and machine.reliability < min_reliability():
        apply_verdict(
            machine,
            Verdict(
                False,
                f"reliability {machine.reliability:.1%} fell below the required "
                f"{min_reliability():.0%}",
            ),
            timezone.now(),
        )
        machine.verification_due_at = timezone.now() + verify_retry()
        machine.save(update_fields=["verification_due_at"])


def hardware_signature(gpus: list, cpu_cores: int) -> tuple:
    """What a re-probe compares to tell a hardware change: the GPUs (UUID, model, memory)
    and the CPU cores."""
    return (tuple(sorted((g.uuid, g.name, g.memory_mib) for g in gpus)), cpu_cores)
