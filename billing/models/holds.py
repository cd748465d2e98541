"""Holds: credit reserved for a rental, captured, released or voided."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

if TYPE_CHECKING:
    pass

from billing.models.ledger import UsageKind


class HoldStatus(models.TextChoices):
    OPEN = "open", "Open"
    RELEASED = "released", "Released"
    VOIDED = "voided", "Voided"


class Hold(models.Model):
    """Credit reserved for one rental: a two-phase transfer that resolves exactly once.

    ``amount`` is all that was ever reserved (extensions add to it); captures per usage kind
    are cumulative; ``released`` is what went back to available when the hold closed.
    """

    team = models.ForeignKey(
        "marketplace.Team", on_delete=models.PROTECT, related_name="billing_holds"
    )
    provider_team = models.ForeignKey(
        "marketplace.Team", on_delete=models.PROTECT, related_name="+"
    )
    reference = models.CharField(max_length=120, help_text='e.g. "rental:42"')
    machine_reference = models.CharField(max_length=120, blank=True, help_text='e.g. "machine:7"')
    description = models.CharField(max_length=300, blank=True)
    idempotency_key = models.CharField(max_length=200, unique=True)
    amount = models.BigIntegerField()
    captured_gpu = models.BigIntegerField(default=0)
    captured_storage = models.BigIntegerField(default=0)
    released = models.BigIntegerField(default=0)
    status = models.CharField(max_length=10, choices=HoldStatus.choices, default=HoldStatus.OPEN)
    created_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="billing_hold_amount_pos"),
            models.CheckConstraint(
                condition=Q(captured_gpu__gte=0, captured_storage__gte=0, released__gte=0),
                name="billing_hold_parts_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(amount__gte=F("captured_gpu") + F("captured_storage") + F("released")),
                name="billing_hold_not_over_resolved",
            ),
            # Open: nothing released yet. Closed: fully resolved. Voided: never captured.
            models.CheckConstraint(
                condition=Q(status=HoldStatus.OPEN, released=0, closed_at__isnull=True)
                | Q(
                    status=HoldStatus.RELEASED,
                    closed_at__isnull=False,
                    amount=F("captured_gpu") + F("captured_storage") + F("released"),
                )
                | Q(
                    status=HoldStatus.VOIDED,
                    closed_at__isnull=False,
                    captured_gpu=0,
                    captured_storage=0,
                    amount=F("released"),
                ),
                name="billing_hold_status_consistent",
            ),
        ]
        indexes = [
            models.Index(fields=["team", "status"], name="billing_hold_team_status"),
            models.Index(fields=["reference"], name="billing_hold_reference"),
        ]

    def __str__(self) -> str:
        return f"Hold {self.pk} for {self.reference} ({self.status})"

    @property
    def captured(self) -> int:
        return self.captured_gpu + self.captured_storage

    @property
    def remaining(self) -> int:
        """What the hold still holds (0 once closed)."""
        return self.amount - self.captured - self.released

    def captured_for(self, kind: str) -> int:
        return self.captured_storage if kind == UsageKind.STORAGE else self.captured_gpu
