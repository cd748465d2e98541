"""The money: a double-entry ledger in integer micro-dollars, two-phase holds, Stripe top-ups.

Every movement is a ``Transfer`` whose ``Entry`` rows sum to zero; each entry changes one
``Account``'s balance and records the balance after it. Transfers and entries are append-only
(the database refuses UPDATE and DELETE on PostgreSQL) and idempotent by a unique key.

Accounts: each team's *available* and *held* credit, *earnings* (as a provider) and
*payout_pending* (earnings a provider asked to be paid, waiting for the operator), and the
platform's *revenue*, *stripe_clearing* (money in from card payments), *grants* (credit given
by operators) and *payouts* (earnings paid out). The two sources of credit, clearing and
grants, run negative; every other account is kept at or above zero by a CHECK constraint, so

    -(stripe_clearing + grants)
        = Σ available + Σ held + Σ earnings + Σ payout_pending + revenue + payouts.

A ``Hold`` reserves credit for a rental (available → held). Captures move part of it to the
provider's earnings and the platform fee to revenue; release returns the rest and closes it;
void returns all of an uncaptured hold. The database checks captured + released ≤ amount.

billing imports no other app: teams are string foreign keys, rentals are references
("rental:42") that callers pass in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

if TYPE_CHECKING:
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor
    from django.db.backends.ddl_references import Statement

_M = TypeVar("_M", bound=models.Model)


class AccountKind(models.TextChoices):
    AVAILABLE = "available", "Available credit"
    HELD = "held", "Held credit"
    EARNINGS = "earnings", "Provider earnings"
    PLATFORM_REVENUE = "platform_revenue", "Platform revenue"
    STRIPE_CLEARING = "stripe_clearing", "Stripe clearing"
    GRANTS = "grants", "Operator grants"
    PAYOUTS = "payouts", "Payouts"
    PAYOUT_PENDING = "payout_pending", "Payout requested"


TEAM_ACCOUNT_KINDS = (
    AccountKind.AVAILABLE,
    AccountKind.HELD,
    AccountKind.EARNINGS,
    AccountKind.PAYOUT_PENDING,
)
# Where credit comes from: these run negative by the amount that came in.
SOURCE_ACCOUNT_KINDS = (AccountKind.STRIPE_CLEARING, AccountKind.GRANTS)


class Account(models.Model):
    team = models.ForeignKey(
        "marketplace.Team",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="billing_accounts",
        help_text="Empty for the platform's own accounts.",
    )
    kind = models.CharField(max_length=20, choices=AccountKind.choices)
    balance = models.BigIntegerField(default=0, help_text="Micro-dollars.")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "kind"],
                condition=Q(team__isnull=False),
                name="billing_account_unique_team_kind",
            ),
            models.UniqueConstraint(
                fields=["kind"],
                condition=Q(team__isnull=True),
                name="billing_account_unique_platform_kind",
            ),
            models.CheckConstraint(
                condition=Q(team__isnull=False, kind__in=TEAM_ACCOUNT_KINDS)
                | Q(team__isnull=True) & ~Q(kind__in=TEAM_ACCOUNT_KINDS),
                name="billing_account_team_iff_team_kind",
            ),
            models.CheckConstraint(
                condition=Q(balance__gte=0) | Q(kind__in=SOURCE_ACCOUNT_KINDS),
                name="billing_account_balance_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team or 'platform'} · {self.get_kind_display()}"


class TransferKind(models.TextChoices):
    TOPUP = "topup", "Top-up"
    GRANT = "grant", "Credit grant"
    HOLD = "hold", "Hold"
    HOLD_EXTEND = "hold_extend", "Hold extended"
    CAPTURE = "capture", "Usage charge"
    RELEASE = "release", "Hold released"
    VOID = "void", "Hold voided"
    PAYOUT = "payout", "Payout"
    PAYOUT_REQUEST = "payout_request", "Payout requested"
    PAYOUT_REJECT = "payout_reject", "Payout rejected"
    # Credit one team sends another (both teams of the person who sends it).
    TEAM_TRANSFER = "team_transfer", "Credit sent between teams"


class UsageKind(models.TextChoices):
    GPU = "gpu", "GPU time"
    STORAGE = "storage", "Storage"


class ChargeUsage(models.TextChoices):
    """What a capture transfer charges for: one usage kind, or both at once (the metering
    sweep posts one capture per hold covering GPU time and storage; ``storage_amount`` says
    how much of it is storage)."""

    GPU = "gpu", "GPU time"
    STORAGE = "storage", "Storage"
    GPU_AND_STORAGE = "gpu+storage", "GPU time + storage"


class ImmutableQuerySet(models.QuerySet[_M]):
    """Ledger rows are added, never edited: no bulk update or delete through the ORM."""

    def update(self, **kwargs: Any) -> NoReturn:
        raise TypeError(f"{self.model.__name__} rows are immutable.")

    def delete(self) -> NoReturn:
        raise TypeError(f"{self.model.__name__} rows are immutable.")

    # Django reads this attribute to keep the methods off the manager; functions take any.
    update.queryset_only = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]


class ImmutableModel(models.Model):
    objects = ImmutableQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise TypeError(f"{type(self).__name__} rows are immutable.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__} rows are immutable.")


class Transfer(ImmutableModel):
    """One balanced movement of money. ``amount`` is its headline (gross) amount."""

    kind = models.CharField(max_length=16, choices=TransferKind.choices)
    # Unique by the constraint below, not unique=True: that would add a second (LIKE) index
    # that no query uses, on the table the metering sweep inserts 100,000 rows a minute into.
    idempotency_key = models.CharField(max_length=200)
    team = models.ForeignKey(
        "marketplace.Team",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,  # reads go through entries; one index less on the hottest insert
        # Checked once per INSERT statement, like the hold below and entries' references (see
        # Entry): a foreign-key trigger per row costs the metering sweep a second.
        db_constraint=False,
        help_text="The team the transfer is for (the renter for holds and charges).",
    )
    reference = models.CharField(
        max_length=120, blank=True, help_text='What it is for, e.g. "rental:42".'
    )
    description = models.CharField(max_length=300, blank=True)
    amount = models.BigIntegerField()
    fee = models.BigIntegerField(default=0, help_text="Platform fee within amount (charges).")
    # Not indexed: no query looks transfers up by their hold (a hold's captures are its
    # cumulative columns), and holds are never deleted; one index less on the sweep's insert.
    hold = models.ForeignKey(
        "billing.Hold",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="transfers",
        db_constraint=False,
        db_index=False,
    )
    usage_kind = models.CharField(max_length=16, choices=ChargeUsage.choices, blank=True)
    storage_amount = models.BigIntegerField(
        default=0,
        help_text="The storage part of a GPU time + storage capture (the rest is GPU time).",
    )
    machine_reference = models.CharField(max_length=120, blank=True)
    # PROTECT: the ledger is append-only (a trigger refuses UPDATE), so SET_NULL could never
    # run; who granted, paid out or paid stays on record. Deactivate such an account instead.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["idempotency_key"], name="billing_transfer_unique_key"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="billing_transfer_amount_pos"),
            models.CheckConstraint(
                condition=Q(fee__gte=0) & Q(fee__lte=F("amount")), name="billing_transfer_fee_range"
            ),
            models.CheckConstraint(
                condition=Q(storage_amount__gte=0) & Q(storage_amount__lte=F("amount")),
                name="billing_transfer_storage_range",
            ),
        ]
        # No index on ``reference``: it is only searched by substring (the ledger's filter,
        # the admin's search), which a b-tree cannot serve, and invoices group a team's
        # entries (read through the team index) by it.

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.reference} ({self.idempotency_key})"

    @property
    def usage_split(self) -> tuple[int, int] | None:
        """(GPU time, storage) parts of a usage charge's amount; None for other transfers.

        Read from ``usage_kind``: a single-kind charge is all of that kind, a GPU time +
        storage charge splits by ``storage_amount`` (the invoices split the same way)."""
        if self.kind != TransferKind.CAPTURE or not self.usage_kind:
            return None
        if self.usage_kind == ChargeUsage.GPU:
            return self.amount, 0
        if self.usage_kind == ChargeUsage.STORAGE:
            return 0, self.amount
        return self.amount - self.storage_amount, self.storage_amount


class AppendOrderIndex(BrinIndex):
    """A block-range (BRIN) index on PostgreSQL, a plain b-tree elsewhere (SQLite).

    For a column that grows with the table's physical order, as an append-only ledger's
    transfer ids do: the index keeps each range of pages' smallest and largest value, a few
    kilobytes for millions of rows, and costs next to nothing per insert, where a b-tree costs
    a descent per row. ``autosummarize`` summarizes each range as soon as it fills, so lookups
    of recent rows need not read the unsummarized tail.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("autosummarize", True)
        super().__init__(*args, **kwargs)

    def create_sql(
        self,
        model: type[models.Model],
        schema_editor: BaseDatabaseSchemaEditor,
        using: str = "",
        **kwargs: Any,
    ) -> Statement:
        if schema_editor.connection.vendor == "postgresql":
            return super().create_sql(model, schema_editor, using, **kwargs)
        return models.Index.create_sql(self, model, schema_editor, using, **kwargs)


class Entry(ImmutableModel):
    """One leg of a transfer: a signed change of one account, with the balance after it."""

    # Both references are checked once per INSERT statement by the ledger's triggers
    # (migration 0005), not by a foreign-key trigger per row: the metering sweep inserts
    # 300,000 entries a minute, and per-row checks were a third of its database time.
    # Transfers, accounts and holds are never deleted (the database refuses), so a reference
    # that was valid at insert stays valid.
    # Indexed by block ranges below: entries are appended in transfer order, batch by batch.
    transfer = models.ForeignKey(
        Transfer,
        on_delete=models.PROTECT,
        related_name="entries",
        db_index=False,
        db_constraint=False,
    )
    # Indexed by (account, id) below.
    account = models.ForeignKey(
        Account,
        on_delete=models.PROTECT,
        related_name="entries",
        db_index=False,
        db_constraint=False,
    )
    # Copied from the account (whose foreign key already guards it) so a team's ledger is one
    # indexed scan on (team, created_at); no second constraint check per entry.
    team = models.ForeignKey(
        "marketplace.Team",
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    account_kind = models.CharField(max_length=20, choices=AccountKind.choices)
    amount = models.BigIntegerField()
    balance_after = models.BigIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "entries"
        constraints = [
            models.CheckConstraint(condition=~Q(amount=0), name="billing_entry_amount_not_zero"),
        ]
        indexes = [
            # The platform's own entries (revenue: one per capture) have no team; no team's
            # ledger reads them, so they stay out of this index.
            models.Index(
                fields=["team", "created_at"],
                name="billing_entry_team_created",
                condition=Q(team__isnull=False),
            ),
            models.Index(fields=["account", "id"], name="billing_entry_account_id"),
            # A transfer's entries (its admin page): every sweep appends 300,000 entries, and a
            # b-tree here cost a twentieth of the sweep's database time (migration 0011).
            AppendOrderIndex(fields=["transfer"], name="billing_entry_transfer_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.account} {self.amount:+d}"


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


class PayoutRequest(models.Model):
    """A provider's request to be paid ``amount`` of their earnings (billing/payouts.py).

    Asking moves the amount from the team's earnings to its payout_pending account
    (``request_transfer``); the operator's decision moves it on to the platform's payouts
    account (paid) or back to earnings (rejected, with a reason) in ``decision_transfer``.
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
            # Waiting: no decision. Decided: when and its transfer; a rejection says why.
            models.CheckConstraint(
                condition=Q(
                    status=PayoutStatus.REQUESTED,
                    decided_at__isnull=True,
                    decision_transfer__isnull=True,
                )
                | Q(
                    status=PayoutStatus.PAID,
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
