"""The provider's Payouts page: ask for a payout of the team's unpaid earnings and see every
request with its status (and, when rejected, why), and cancel one that still waits. Writes go
through ``billing.payouts``; reads are scoped to the active team by the tenancy gateway. The
page updates itself on the team's ``balance.changed`` events: every payout step (asked,
cancelled, paid, rejected) moves the team's earnings, so each sends one."""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from billing import payouts
from billing.errors import BillingError
from billing.models import Account, AccountKind, PayoutRequest, PayoutStatus
from billing.money import MICRO_PER_CENT, micro_to_decimal_str, parse_usd
from marketplace.models import Role
from marketplace.tenancy import role_allows, team_objects

HISTORY_SIZE = 100


class PayoutForm(forms.Form):
    amount = forms.CharField(
        label="Amount (USD)",
        max_length=20,
        widget=forms.TextInput({"inputmode": "decimal", "autocomplete": "off"}),
    )
    nonce = forms.CharField(widget=forms.HiddenInput, max_length=150)

    def clean_amount(self) -> int:
        try:
            amount = parse_usd(self.cleaned_data["amount"], max_decimals=2)
            payouts.payout_validate_amount(amount)
        except BillingError as error:
            raise forms.ValidationError(str(error)) from error
        return amount


def _balances(request: HttpRequest) -> dict[str, int]:
    kinds = [AccountKind.EARNINGS, AccountKind.PAYOUT_PENDING]
    found = dict(
        team_objects(request.team, Account.objects.filter(kind__in=kinds)).values_list(
            "kind", "balance"
        )
    )
    return {kind: found.get(kind, 0) for kind in kinds}


def _can_ask(request: HttpRequest) -> bool:
    # The admin role, as for the machines: a payout sends the team's money out.
    return role_allows(request, Role.ADMIN)


@login_required
def payouts_page(request: HttpRequest) -> HttpResponse:
    balances = _balances(request)
    unpaid = balances[AccountKind.EARNINGS]
    form = PayoutForm(
        request.POST or None,
        # The whole unpaid balance in whole cents: the usual ask.
        initial={
            "amount": micro_to_decimal_str(unpaid - unpaid % MICRO_PER_CENT)[:-4],
            "nonce": uuid.uuid4().hex,
        },
    )
    status = 200
    if request.method == "POST":
        if not _can_ask(request):
            messages.error(request, "Only the team's admins and owner can ask for a payout.")
            return redirect("payouts")
        if form.is_valid():
            try:
                _, created = payouts.payout_request_create(
                    team_id=request.team.pk,
                    amount=form.cleaned_data["amount"],
                    # One request per rendered form: submitting it twice asks once.
                    idempotency_key=f"console:{form.cleaned_data['nonce']}",
                    requested_by_id=request.user.pk,
                )
            except BillingError as error:
                for field, problems in error.fields.items():
                    form.add_error(field if field in form.fields else None, problems)
                if not error.fields:
                    form.add_error(None, str(error))
            else:
                if created:
                    messages.success(request, "Payout requested. The operator reviews it next.")
                return redirect("payouts")
        status = 400
    history = team_objects(
        request.team,
        PayoutRequest.objects.select_related("decided_by").order_by("-created_at", "-pk"),
    )
    context = {
        "form": form,
        "unpaid": unpaid,
        "pending": balances[AccountKind.PAYOUT_PENDING],
        "minimum": payouts.payout_minimum(),
        "can_ask": _can_ask(request),
        "history": history[:HISTORY_SIZE],
        "waiting": history.filter(status=PayoutStatus.REQUESTED).first(),
    }
    return render(request, "billing/payouts.html", context, status=status)


@login_required
@require_POST
def payout_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    # Another team's request is not found, whatever the caller's role.
    if not team_objects(request.team, PayoutRequest.objects.filter(pk=pk)).exists():
        raise Http404("No such payout request.")
    if not _can_ask(request):
        messages.error(request, "Only the team's admins and owner can cancel a payout request.")
        return redirect("payouts")
    try:
        payouts.payout_cancel(
            team_id=request.team.pk, payout_id=pk, cancelled_by_id=request.user.pk
        )
    except BillingError as error:  # paid or rejected meanwhile: it says which
        messages.error(request, str(error))
    else:
        messages.success(request, "Payout request cancelled; the amount is back in your earnings.")
    return redirect("payouts")


urlpatterns: list = [
    path("payouts/", payouts_page, name="payouts"),
    path("payouts/<int:pk>/cancel/", payout_cancel, name="payout-cancel"),
]
