"""Stripe top-ups and the webhook events that credit them once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

if TYPE_CHECKING:
    pass

from billing.models.ledger import Transfer


class TopUpStatus(models.TextChoices):
    PENDING = "pending", "Waiting for payment"
    PROCESSING = "processing", "Payment processing"
    PAID = "paid", "Credited"
    FAILED = "failed", "Payment failed"
    EXPIRED = "expired", "Expired"


class TopUp(models.Model):
    """A card payment through Stripe Checkout that credits a team's available balance once."""

    team = models.ForeignKey("marketplace.Team", on_delete=models.PROTECT, related_name="+")
    amount = models.BigIntegerField(help_text="Micro-dollars asked for (whole cents).")
    amount_paid = models.BigIntegerField(default=0, help_text="Micro-dollars credited.")
    status = models.CharField(
        max_length=12, choices=TopUpStatus.choices, default=TopUpStatus.PENDING
    )
    checkout_session_id = models.CharField(max_length=255, unique=True, null=True, blank=True)
    checkout_url = models.URLField(max_length=2000, blank=True)
    transfer = models.OneToOneField(
        Transfer, on_delete=models.PROTECT, null=True, blank=True, related_name="topup"
    )
    failure_reason = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
    )
    created_at = models.DateTimeField(default=timezone.now)
    credited_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="billing_topup_amount_pos"),
            models.CheckConstraint(
                condition=~Q(status=TopUpStatus.PAID) | Q(transfer__isnull=False),
                name="billing_topup_paid_has_transfer",
            ),
        ]

    def __str__(self) -> str:
        return f"Top-up {self.pk} ({self.status})"


class StripeEventStatus(models.TextChoices):
    RECEIVED = "received", "Received"
    PROCESSED = "processed", "Processed"
    IGNORED = "ignored", "Ignored"
    FAILED = "failed", "Failed"


class StripeEvent(models.Model):
    """Each Stripe event stored once (unique id) with how its handling went."""

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    livemode = models.BooleanField(default=False)
    payload = models.JSONField()
    status = models.CharField(
        max_length=10, choices=StripeEventStatus.choices, default=StripeEventStatus.RECEIVED
    )
    detail = models.TextField(blank=True, help_text="Why it was ignored, or the error.")
    deliveries = models.PositiveIntegerField(default=1)
    received_at = models.DateTimeField(default=timezone.now)
    handled_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.type} {self.event_id} ({self.status})"
