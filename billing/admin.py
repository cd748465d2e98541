"""Operators see the books read-only here, grant credit and record payouts to providers.

Both writes go through the billing services, so they are balanced ledger transfers like any
other, idempotent per rendered form, and audited: the transfer names the operator
(``created_by``) and the admin's history (LogEntry) records the action.

Credit grants stay in production, with Stripe configured: they are how support credit,
refunds and goodwill reach a team. They come from the platform's own grants account, apart
from card money (stripe_clearing), need the add-credit-grant permission, not just staff, and
carry a reason the team sees in its ledger. The DEBUG test-credit button is another matter:
it never exists with DEBUG off or with Stripe keys (settings.TEST_CREDIT_ENABLED).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from billing import credits, payouts
from billing.errors import BillingError, IdempotencyConflict, InsufficientEarnings
from billing.models import (
    Account,
    AccountKind,
    CreditGrant,
    Entry,
    Hold,
    Payout,
    PayoutDestination,
    PayoutRequest,
    PayoutStatus,
    StripeEvent,
    TopUp,
    Transfer,
    TransferKind,
)
from billing.money import format_usd, parse_usd

if TYPE_CHECKING:
    # django-stubs makes these generic over their model; Django's classes take no subscript at
    # run time (django-stubs-ext's monkeypatch would add one, but it is a dev-only package).
    _AnyModelAdmin = admin.ModelAdmin[Any]  # ReadOnlyAdmin serves several models
    _CreditGrantAdmin = admin.ModelAdmin[CreditGrant]
    _TransferAdmin = admin.ModelAdmin[Transfer]  # payouts: its pages show and write transfers
    _PayoutRequestAdmin = admin.ModelAdmin[PayoutRequest]
    _PayoutDestinationAdmin = admin.ModelAdmin[PayoutDestination]
    _EntryInline = admin.TabularInline[Entry, Transfer]
    _CreditGrantForm = forms.ModelForm[CreditGrant]
else:
    _AnyModelAdmin = _CreditGrantAdmin = _TransferAdmin = admin.ModelAdmin
    _PayoutRequestAdmin = _PayoutDestinationAdmin = admin.ModelAdmin
    _EntryInline = admin.TabularInline
    _CreditGrantForm = forms.ModelForm


class ReadOnlyAdmin(_AnyModelAdmin):
    """The ledger is written by services only; the admin shows it."""

    def has_add_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False


def _usd(field: str, label: str) -> Callable[[Any, models.Model], str]:
    """A list column showing a micro-dollar field in dollars, sorted by the field."""

    @admin.display(description=label, ordering=field)
    def show(self: Any, obj: models.Model) -> str:
        return format_usd(getattr(obj, field))

    return show


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ["id", "team", "kind", "balance_usd", "payout_link"]
    list_filter = ["kind"]
    search_fields = ["team__name"]
    balance_usd = _usd("balance", "Balance")

    @admin.display(description="Payout")
    def payout_link(self, account: Account) -> str:
        """On a provider's earnings account: record a payout of them."""
        if account.kind != AccountKind.EARNINGS or account.balance <= 0:
            return ""
        url = reverse("admin:billing_payout_add")
        return format_html('<a href="{}?account={}">Record payout…</a>', url, account.pk)


_ENTRY_INLINE_FIELDS = ("account", "amount", "balance_after")


class EntryInline(_EntryInline):
    model = Entry
    fields = _ENTRY_INLINE_FIELDS
    readonly_fields = _ENTRY_INLINE_FIELDS
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Transfer | None = None) -> bool:
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


class CreditGrantForm(_CreditGrantForm):
    amount_usd = forms.CharField(label="Amount (USD)", help_text="For example 50 or 12.50.")
    reason = forms.CharField(
        max_length=300,
        help_text="Shown in the team's ledger, e.g. “Refund: rental 42 failed to start”. "
        "Grants are for support credit, refunds and goodwill; card payments arrive through "
        "Stripe on their own. Your name is recorded with the grant.",
    )
    idempotency_key = forms.CharField(widget=forms.HiddenInput)

    class Meta:
        model = CreditGrant
        fields = ["team"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
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

    def clean(self) -> dict[str, Any]:
        """A form submitted again grants nothing more; one resubmitted with other figures is
        refused here, naming the grant it already made, rather than failing in the service."""
        super().clean()  # a model form's clean returns its cleaned_data
        data = self.cleaned_data
        earlier = Transfer.objects.filter(
            idempotency_key=f"grant:{data.get('idempotency_key', '')}"
        ).first()
        team, amount = data.get("team"), data.get("amount_usd")
        if earlier and team and amount and (earlier.team_id, earlier.amount) != (team.pk, amount):
            raise ValidationError(
                f"This form already granted {format_usd(earlier.amount)} to {earlier.team};"
                " open a new form for another grant."
            )
        return data


@admin.register(CreditGrant)
class CreditGrantAdmin(_CreditGrantAdmin):
    """Grant credit to a team: a balanced transfer from the platform's grants account."""

    form = CreditGrantForm
    list_display = ["id", "created_at", "team", "amount_usd", "description", "created_by"]
    search_fields = ["team__name", "description", "created_by__username"]
    date_hierarchy = "created_at"
    raw_id_fields = ["team"]
    amount_usd = _usd("amount", "Amount")

    def get_queryset(self, request: HttpRequest) -> QuerySet[CreditGrant]:
        return super().get_queryset(request).filter(kind=TransferKind.GRANT)

    def has_change_permission(self, request: HttpRequest, obj: CreditGrant | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: CreditGrant | None = None) -> bool:
        return False

    def save_model(
        self, request: HttpRequest, obj: CreditGrant, form: CreditGrantForm, change: bool
    ) -> None:
        data = form.cleaned_data
        transfer = credits.credit_grant(
            team_id=data["team"].pk,
            amount=data["amount_usd"],
            reason=data["reason"],
            idempotency_key=data["idempotency_key"],
            created_by_id=request.user.pk,
        )
        obj.pk = transfer.pk
        obj._state.adding = False
        messages.info(request, f"Granted {format_usd(transfer.amount)} to {data['team']}.")

    def save_related(
        self, request: HttpRequest, form: CreditGrantForm, formsets: Any, change: bool
    ) -> None:
        pass


class PayoutForm(forms.Form):
    account = forms.ModelChoiceField(
        queryset=Account.objects.filter(kind=AccountKind.EARNINGS, team__isnull=False)
        .select_related("team")
        .order_by("team__name"),
        label="Provider",
        help_text="The provider's unpaid earnings; the payout moves money from them to the"
        " platform's payouts account.",
    )
    amount_usd = forms.CharField(label="Amount (USD)", help_text="For example 120 or 85.50.")
    note = forms.CharField(
        max_length=300,
        help_text="Shown in the provider's ledger, e.g. the bank transfer's reference.",
    )
    idempotency_key = forms.CharField(widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # form.fields holds a copy of the field declared above, so still a ModelChoiceField.
        account_field = cast("forms.ModelChoiceField[Account]", self.fields["account"])
        # One field's labels: Django looks the method up on the instance, so this replaces it.
        account_field.label_from_instance = lambda obj: (  # type: ignore[method-assign]
            f"{obj.team} — {format_usd(obj.balance)} unpaid"
        )

    def clean_amount_usd(self) -> int:
        try:
            amount = parse_usd(self.cleaned_data["amount_usd"])
        except BillingError as error:
            raise ValidationError(str(error)) from error
        if amount <= 0:
            raise ValidationError("The amount must be positive.")
        return amount


@admin.register(Payout)
class PayoutAdmin(_TransferAdmin):
    """Record money paid out to a provider (the bank transfer itself happens elsewhere): a
    ledger transfer from their earnings, never more than they have, once per form."""

    list_display = ["id", "created_at", "team", "amount_usd", "description", "created_by"]
    search_fields = ["team__name", "description"]
    date_hierarchy = "created_at"
    amount_usd = _usd("amount", "Amount")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Transfer]:
        return super().get_queryset(request).filter(kind=TransferKind.PAYOUT)

    def has_change_permission(self, request: HttpRequest, obj: Transfer | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Transfer | None = None) -> bool:
        return False

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """A form of our own, not a model form: the service checks the earnings under the
        account's lock, and its refusal must come back as a form error, not a server error."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        # One payout per rendered form: submitting it twice records it once.
        initial: dict[str, str | int] = {"idempotency_key": f"admin:{uuid.uuid4()}"}
        if request.GET.get("account", "").isdigit():
            initial["account"] = int(request.GET["account"])
        form = PayoutForm(request.POST or None, initial=initial)
        if request.method == "POST" and form.is_valid():
            transfer = self._record(request, form)
            if transfer is not None:
                return redirect("admin:billing_payout_changelist")
        context = {
            **self.admin_site.each_context(request),
            **(extra_context or {}),
            "title": "Record a payout",
            "form": form,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "billing/admin_payout.html", context)

    def _record(self, request: HttpRequest, form: PayoutForm) -> Transfer | None:
        data = form.cleaned_data
        account = data["account"]
        try:
            transfer = credits.payout_record(
                provider_team_id=account.team_id,
                amount=data["amount_usd"],
                idempotency_key=data["idempotency_key"],
                note=data["note"],
                created_by_id=request.user.pk,
            )
        except InsufficientEarnings as error:
            form.add_error("amount_usd", str(error))
            return None
        except IdempotencyConflict:
            form.add_error(None, "This form already recorded another payout; reload the page.")
            return None
        self.log_addition(request, transfer, f"Recorded payout of {format_usd(transfer.amount)}")
        messages.success(
            request, f"Recorded a payout of {format_usd(transfer.amount)} to {account.team}."
        )
        return transfer


PAYOUT_DECISIONS = [("approve", "Paid: I sent the money"), ("reject", "Reject")]


class PayoutDecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=PAYOUT_DECISIONS, widget=forms.RadioSelect)

    def __init__(self, *args: Any, stripe_destination: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if stripe_destination:
            decision = cast("forms.ChoiceField", self.fields["decision"])
            decision.choices = [
                ("stripe", f"Pay now through Stripe Connect, to {stripe_destination}"),
                *PAYOUT_DECISIONS,
            ]

    note = forms.CharField(
        max_length=300,
        required=False,
        help_text="When paid: the payment's reference (e.g. the bank transfer's).",
    )
    reason = forms.CharField(
        max_length=300,
        required=False,
        help_text="When rejected: why. The provider reads it; the amount goes back to their"
        " earnings.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("decision") == "reject" and not (data.get("reason") or "").strip():
            self.add_error("reason", "Say why the payout is rejected; the provider reads it.")
        return data


@admin.register(PayoutRequest)
class PayoutRequestAdmin(_PayoutRequestAdmin):
    """Providers' payout requests: pay them (after sending the money) or reject them with a
    reason. Both go through billing.payouts, as balanced ledger transfers; deciding twice
    changes nothing."""

    list_display = [
        "id", "created_at", "team", "amount_usd", "status", "requested_by", "decided_by",
    ]  # fmt: skip
    list_filter = ["status"]
    search_fields = ["team__name", "note", "reason"]
    date_hierarchy = "created_at"
    amount_usd = _usd("amount", "Amount")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # providers ask for payouts; operators decide them

    def has_delete_permission(self, request: HttpRequest, obj: PayoutRequest | None = None) -> bool:
        return False

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        payout = self.get_object(request, object_id)
        if payout is None or not self.has_view_or_change_permission(request, payout):
            raise PermissionDenied
        can_decide = payout.status == PayoutStatus.REQUESTED and self.has_change_permission(
            request, payout
        )
        form = PayoutDecisionForm(
            request.POST or None, stripe_destination=payouts.stripe_destination(payout.team_id)
        )
        if request.method == "POST":
            if not can_decide:
                raise PermissionDenied
            if form.is_valid() and self._decide(request, payout, form):
                return redirect("admin:billing_payoutrequest_changelist")
        context = {
            **self.admin_site.each_context(request),
            **(extra_context or {}),
            "title": f"Payout request {payout.pk}",
            "payout": payout,
            "form": form if can_decide else None,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "billing/admin_payout_request.html", context)

    def _decide(
        self, request: HttpRequest, payout: PayoutRequest, form: PayoutDecisionForm
    ) -> bool:
        data = form.cleaned_data
        try:
            if data["decision"] == "stripe":
                decided = payouts.payout_pay_with_stripe(
                    payout_id=payout.pk, decided_by_id=request.user.pk
                )
            elif data["decision"] == "approve":
                decided = payouts.payout_approve(
                    payout_id=payout.pk, note=data["note"], decided_by_id=request.user.pk
                )
            else:
                decided = payouts.payout_reject(
                    payout_id=payout.pk, reason=data["reason"], decided_by_id=request.user.pk
                )
        # Decided meanwhile the other way by another operator, or Stripe refused to pay.
        except BillingError as error:
            form.add_error(None, str(error))
            return False
        self.log_change(request, decided, f"{decided.get_status_display()}")
        messages.success(
            request,
            f"Payout request {decided.pk} of {format_usd(decided.amount)} to {decided.team}: "
            f"{decided.get_status_display().lower()}.",
        )
        return True


@admin.register(PayoutDestination)
class PayoutDestinationAdmin(_PayoutDestinationAdmin):
    """Providers' Stripe Connect accounts, for paying payout requests through Stripe."""

    list_display = ["team", "stripe_account_id", "created_at"]
    search_fields = ["team__name", "stripe_account_id"]
