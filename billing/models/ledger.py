"""Accounts, transfers and entries: the double-entry ledger (the package says how it balances)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
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
    PAYOUT_CANCEL = "payout_cancel", "Payout cancelled"
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
