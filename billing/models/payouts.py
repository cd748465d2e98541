"""Credit grants and payouts (transfers of their own kinds), payout requests and destinations."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

if TYPE_CHECKING:
    pass

from billing.models.ledger import Transfer


class CreditGrant(Transfer):
    """Admin face of credit grants (a proxy: the grant *is* the ledger transfer)."""

    class Meta:
        proxy = True
        verbose_name = "credit grant"


class Payout(Transfer):
    """Admin face of payouts to providers (a proxy: the payout *is* the ledger transfer)."""

    class Meta:
        proxy = True
        verbose_name = "payout"


class PayoutStatus(models.TextChoices):
    REQUESTED = "requested", "Waiting for approval"
    PAID = "paid", "Paid"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"


class PayoutRequest(models.Model):
    """A provider's request to be paid ``amount`` of their earnings (billing/payouts.py).

    Asking moves the amount from the team's earnings to its payout_pending account
    (``request_transfer``); the operator's decision moves it on to the platform's payouts
    account (paid) or back to earnings (rejected, with a reason) in ``decision_transfer``.
    The provider may take a waiting request back (cancelled): that is its decision, back to
    earnings, with who cancelled it and when in ``decided_by`` and ``decided_at``.
    """

    team = models.ForeignKey("marketplace.Team", on_delete=models.PROTECT, related_name="+")
    amount = models.BigIntegerField(help_text="Micro-dollars (whole cents).")
    status = models.CharField(
        max_length=10, choices=PayoutStatus.choices, default=PayoutStatus.REQUESTED
    )
    idempotency_key = models.CharField(
        max_length=150, blank=True, help_text="The requester's key: a retry returns this request."
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
    )
    # Empty only inside the transaction that makes the request (its transfer names it).
    request_transfer = models.OneToOneField(
        Transfer,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="payout_requested",
    )
    decision_transfer = models.OneToOneField(
        Transfer,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="payout_decided",
    )
    reason = models.CharField(
        max_length=300, blank=True, help_text="Why it was rejected (the provider reads it)."
    )
    note = models.CharField(
        max_length=300, blank=True, help_text="The payment's reference, e.g. the bank transfer's."
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
    )
    created_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="billing_payout_amount_pos"),
            # One request waits at a time per team: the next one is asked after the decision.
            models.UniqueConstraint(
                fields=["team"],
                condition=Q(status=PayoutStatus.REQUESTED),
                name="billing_payout_one_open_per_team",
            ),
            models.UniqueConstraint(
                fields=["team", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="billing_payout_unique_team_key",
            ),
            # Waiting: no decision. Decided (paid, cancelled): when and its transfer; a
            # rejection says why too.
            models.CheckConstraint(
                condition=Q(
                    status=PayoutStatus.REQUESTED,
                    decided_at__isnull=True,
                    decision_transfer__isnull=True,
                )
                | Q(
                    status__in=[PayoutStatus.PAID, PayoutStatus.CANCELLED],
                    decided_at__isnull=False,
                    decision_transfer__isnull=False,
                )
                | Q(
                    Q(status=PayoutStatus.REJECTED)
                    & ~Q(reason="")
                    & Q(decided_at__isnull=False, decision_transfer__isnull=False)
                ),
                name="billing_payout_status_consistent",
            ),
        ]
        indexes = [models.Index(fields=["team", "-created_at"], name="billing_payout_team_new")]

    def __str__(self) -> str:
        return f"Payout request {self.pk} ({self.status})"


class PayoutDestination(models.Model):
    """Where a provider's payouts go when the operator pays them through Stripe Connect: the
    provider's connected account (set by the operator; onboarding is not built here)."""

    team = models.OneToOneField("marketplace.Team", on_delete=models.PROTECT, related_name="+")
    stripe_account_id = models.CharField(
        max_length=255,
        validators=[
            RegexValidator(r"^acct_[A-Za-z0-9]+$", "A Stripe account id, like acct_1Nv0FG…")
        ],
        help_text="The provider's Stripe Connect account, acct_….",
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.team} → {self.stripe_account_id}"
