"""Operators see the books read-only and grant credit here (the embedded default has no Stripe)."""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from billing import services
from billing.errors import BillingError
from billing.models import (
    Account,
    CreditGrant,
    Entry,
    Hold,
    StripeEvent,
    TopUp,
    Transfer,
    TransferKind,
)
from billing.money import format_usd, parse_usd


class ReadOnlyAdmin(admin.ModelAdmin):
    """The ledger is written by services only; the admin shows it."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _usd(field: str, label: str):
    def show(self, obj):
        return format_usd(getattr(obj, field))

    show.short_description = label
    show.admin_order_field = field
    return show


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ["id", "team", "kind", "balance_usd"]
    list_filter = ["kind"]
    search_fields = ["team__name"]
    balance_usd = _usd("balance", "Balance")


class EntryInline(admin.TabularInline):
    model = Entry
    fields = ["account", "amount", "balance_after"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Transfer)
class TransferAdmin(ReadOnlyAdmin):
    list_display = ["id", "created_at", "kind", "team", "reference", "amount_usd", "fee_usd"]
    list_filter = ["kind", "usage_kind"]
    search_fields = ["reference", "idempotency_key", "team__name"]
    date_hierarchy = "created_at"
    inlines = [EntryInline]
    amount_usd = _usd("amount", "Amount")
    fee_usd = _usd("fee", "Fee")


@admin.register(Hold)
class HoldAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "team",
        "provider_team",
        "reference",
        "status",
        "amount_usd",
        "created_at",
    ]
    list_filter = ["status"]
    search_fields = ["reference", "team__name"]
    amount_usd = _usd("amount", "Amount")


@admin.register(TopUp)
class TopUpAdmin(ReadOnlyAdmin):
    list_display = ["id", "team", "amount_usd", "status", "checkout_session_id", "created_at"]
    list_filter = ["status"]
    amount_usd = _usd("amount", "Amount")


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "type", "status", "deliveries", "received_at", "handled_at"]
    list_filter = ["status", "type"]
    search_fields = ["event_id"]


class CreditGrantForm(forms.ModelForm):
    amount_usd = forms.CharField(label="Amount (USD)", help_text="For example 50 or 12.50.")
    reason = forms.CharField(max_length=300, help_text="Shown in the team's ledger.")
    idempotency_key = forms.CharField(widget=forms.HiddenInput)

    class Meta:
        model = CreditGrant
        fields = ["team"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].required = True
        # One grant per rendered form: submitting it twice credits once.
        self.fields["idempotency_key"].initial = f"admin:{uuid.uuid4()}"

    def clean_amount_usd(self) -> int:
        try:
            amount = parse_usd(self.cleaned_data["amount_usd"])
        except BillingError as error:
            raise ValidationError(str(error)) from error
        if amount <= 0:
            raise ValidationError("The amount must be positive.")
        return amount


@admin.register(CreditGrant)
class CreditGrantAdmin(admin.ModelAdmin):
    """Grant credit to a team: a balanced transfer from the platform's grants account."""

    form = CreditGrantForm
    list_display = ["id", "created_at", "team", "amount_usd", "description", "created_by"]
    search_fields = ["team__name", "description"]
    raw_id_fields = ["team"]
    amount_usd = _usd("amount", "Amount")

    def get_queryset(self, request):
        return super().get_queryset(request).filter(kind=TransferKind.GRANT)

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        transfer = services.credit_grant(
            team_id=data["team"].pk,
            amount=data["amount_usd"],
            reason=data["reason"],
            idempotency_key=data["idempotency_key"],
            created_by_id=request.user.pk,
        )
        obj.pk = transfer.pk
        obj._state.adding = False
        messages.info(request, f"Granted {format_usd(transfer.amount)} to {data['team']}.")

    def save_related(self, request, form, formsets, change):
        pass
