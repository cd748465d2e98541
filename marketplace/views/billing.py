"""Console pages for the billing room (views live here so they go through the tenancy gateway).

Every query is scoped with ``team_objects`` / ``team_object_or_404`` to the active team;
writes go through ``billing.topups`` and ``billing.credits``.
"""

from __future__ import annotations

import csv
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.staticfiles import finders
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing import credits, selectors, topups
from billing.errors import BillingError
from billing.models import Account, Entry, Hold, HoldStatus, TopUp, TopUpStatus, TransferKind
from billing.money import format_amount, micro_to_decimal_str, parse_usd
from billing.views import stripe_webhook
from marketplace import money_names
from marketplace.invoice_rows import invoice_page
from marketplace.models import Role, Team
from marketplace.tenancy import role_allows, team_object_or_404, team_objects

LEDGER_PAGE_SIZE = 50


# --- forms -----------------------------------------------------------------------------------


class LedgerFilterForm(forms.Form):
    start = forms.DateField(required=False, label="From", widget=forms.DateInput({"type": "date"}))
    end = forms.DateField(required=False, label="To", widget=forms.DateInput({"type": "date"}))
    kind = forms.ChoiceField(
        required=False, choices=[("", "All kinds"), *TransferKind.choices], label="Kind"
    )
    reference = forms.CharField(required=False, max_length=120, label="Reference")

    def clean(self):
        data = super().clean()
        if data.get("start") and data.get("end") and data["start"] > data["end"]:
            raise forms.ValidationError("The start date must not be after the end date.")
        return data

    def to_filter(self, team: Team) -> selectors.LedgerFilter:
        """The ledger's filter; a Reference also finds rows by the names the page shows,
        among the team's own rentals and machines."""
        if not self.is_valid():
            return selectors.LedgerFilter()
        data = self.cleaned_data
        reference = (data.get("reference") or "").strip()
        named = money_names.references_named(team, reference) if reference else None
        return selectors.LedgerFilter(
            start=data.get("start"),
            end=data.get("end"),
            kind=data.get("kind") or "",
            reference=reference,
            named_references=named.rentals if named else None,
            named_machine_references=named.machines if named else None,
        )


class TopUpForm(forms.Form):
    amount = forms.CharField(
        label="Amount (USD)",
        max_length=20,
        widget=forms.TextInput({"inputmode": "decimal", "placeholder": "25.00"}),
    )

    def clean_amount(self) -> int:
        try:
            amount = parse_usd(self.cleaned_data["amount"], max_decimals=2)
            topups.topup_validate_amount(amount)
        except BillingError as error:
            raise forms.ValidationError(str(error)) from error
        return amount


# --- helpers ---------------------------------------------------------------------------------


def _entries(request: HttpRequest):
    return team_objects(request.team, Entry.objects.all())


def _can_pay(request: HttpRequest) -> bool:
    return role_allows(request, Role.MEMBER)


# --- ledger rows as people read them ------------------------------------------------------------

# A hold event's one row: what happened and which way the credit moved.
HOLD_EVENTS = {
    TransferKind.HOLD: ("Hold placed", "Available → Held"),
    TransferKind.HOLD_EXTEND: ("Hold extended", "Available → Held"),
    TransferKind.RELEASE: ("Hold released", "Held → Available"),
    TransferKind.VOID: ("Hold voided", "Held → Available"),
}


@dataclass(frozen=True)
class LedgerRow:
    entry: Entry
    what: str  # "Hold placed", "Usage charge", …
    account: str  # "Available", or "Available → Held" for a hold event
    moved: bool  # a hold event: credit moved between the team's own accounts
    rental: money_names.RentalName | None
    machine_name: str | None = None  # the team's own machine it was earned on (providers)

    @property
    def amount(self) -> int:
        """A hold event's amount, unsigned (it stays the team's); otherwise the change."""
        return abs(self.entry.amount) if self.moved else self.entry.amount


def _ledger_rows(request: HttpRequest, entries: list[Entry]) -> list[LedgerRow]:
    names = money_names.rental_names(request.team, (e.transfer.reference for e in entries))
    machines = money_names.machine_names(
        request.team, (e.transfer.machine_reference for e in entries)
    )
    rows = []
    for entry in entries:
        transfer = entry.transfer
        event = HOLD_EVENTS.get(transfer.kind)
        what, account = event or (transfer.get_kind_display(), entry.get_account_kind_display())
        rental = names.get(transfer.reference)
        machine = None if rental else machines.get(transfer.machine_reference)
        rows.append(LedgerRow(entry, what, account, event is not None, rental, machine))
    return rows


def _open_holds(request: HttpRequest) -> list[tuple[Hold, money_names.RentalName | None]]:
    holds = list(
        team_objects(request.team, Hold.objects.filter(status=HoldStatus.OPEN)).order_by(
            "-created_at"
        )[:20]
    )
    names = money_names.rental_names(request.team, (hold.reference for hold in holds))
    return [(hold, names.get(hold.reference)) for hold in holds]


# --- pages -----------------------------------------------------------------------------------


@login_required
def balance(request: HttpRequest) -> HttpResponse:
    team = request.team
    current = selectors.balance_from_accounts(team_objects(team, Account.objects.all()))
    filter_form = LedgerFilterForm(request.GET or None)
    entries = selectors.ledger_rows(_entries(request), filter_form.to_filter(request.team))
    page = Paginator(entries, LEDGER_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "balance": current,
        "balance_series": selectors.balance_series(_entries(request), days=30),
        "filter_form": filter_form,
        "page": page,
        "query": query.urlencode(),
        "ledger_rows": _ledger_rows(request, list(page.object_list)),
        "open_holds": _open_holds(request),
        "topup_form": TopUpForm(),
        "stripe_enabled": bool(settings.STRIPE_SECRET_KEY),
        "test_credit_enabled": settings.TEST_CREDIT_ENABLED,
        "test_credit_amount": settings.BILLING_TEST_CREDIT_AMOUNT,
        "test_credit_nonce": uuid.uuid4().hex,
        "topup_min": settings.BILLING_TOPUP_MIN,
        "topup_max": settings.BILLING_TOPUP_MAX,
        "can_pay": _can_pay(request),
        "recent_topups": team_objects(team, TopUp.objects.all()).order_by("-created_at")[:5],
    }
    return render(request, "billing/balance.html", context)


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_text(value: str) -> str:
    """Keep spreadsheets from running text as a formula (CSV injection)."""
    return f"'{value}" if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def _usage_columns(transfer) -> tuple[str, str]:
    """The GPU time and storage parts of a usage charge, as decimal dollars; empty otherwise."""
    split = transfer.usage_split
    if split is None:
        return "", ""
    return micro_to_decimal_str(split[0]), micro_to_decimal_str(split[1])


@login_required
def ledger_csv(request: HttpRequest) -> StreamingHttpResponse:
    filter_form = LedgerFilterForm(request.GET or None)
    entries = selectors.ledger_entries(_entries(request), filter_form.to_filter(request.team))
    writer = csv.writer(_Echo())
    # gpu_usd and storage_usd split a usage charge's gross amount (what the renter paid, fee
    # included) by kind; they are empty on other rows. amount_usd is this account's change.
    header = [
        "time_utc", "transfer_id", "kind", "reference", "usage", "account", "amount_usd",
        "gpu_usd", "storage_usd", "balance_after_usd", "description",
    ]  # fmt: skip

    def rows():
        yield writer.writerow(header)
        for entry in entries.iterator(chunk_size=2000):
            transfer = entry.transfer
            yield writer.writerow(
                [
                    entry.created_at.astimezone(UTC).isoformat(),
                    transfer.pk,
                    transfer.kind,
                    _csv_text(transfer.reference),
                    transfer.usage_kind,
                    entry.account_kind,
                    micro_to_decimal_str(entry.amount),
                    *_usage_columns(transfer),
                    micro_to_decimal_str(entry.balance_after),
                    _csv_text(transfer.description),
                ]
            )

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    filename = f"ledger-team{request.team.pk}-{timezone.localdate():%Y%m%d}.csv"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
def invoices(request: HttpRequest) -> HttpResponse:
    months = selectors.invoice_months(_entries(request))
    return render(request, "billing/invoices.html", {"months": months})


def _month(value: str) -> date:
    try:
        return datetime.strptime(value, "%Y-%m").date()
    except ValueError as error:
        raise Http404 from error


def _invoice(request: HttpRequest, month: str) -> selectors.Invoice:
    found = selectors.invoice_for_month(_entries(request), _month(month))
    if not found.lines and not found.credit_added:
        raise Http404
    return found


@login_required
def invoice(request: HttpRequest, month: str) -> HttpResponse:
    found = _invoice(request, month)
    context = {"invoice": found, "page": invoice_page(request.team, found), "team": request.team}
    return render(request, "billing/invoice.html", context)


# The console's own stylesheet (its print rules included), plus the page box of a document.
INVOICE_PAGE_CSS = "@page { size: A4; margin: 16mm 14mm; } body { background: #fff; }"


@login_required
def invoice_pdf(request: HttpRequest, month: str) -> HttpResponse:
    """The invoice as a PDF, laid out by WeasyPrint from the same markup as the page.

    WeasyPrint is handed the HTML and the stylesheet as text, and the document links to
    nothing, so rendering never fetches a URL."""
    found = _invoice(request, month)
    try:
        from weasyprint import CSS, HTML
    except OSError:  # its Pango libraries are missing on this machine
        return HttpResponse(
            "PDF invoices need Pango on the server (apt-get install libpango-1.0-0 "
            "libpangoft2-1.0-0); print the invoice page instead.",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
    document = render_to_string(
        "billing/invoice_document.html",
        {"invoice": found, "page": invoice_page(request.team, found), "team": request.team},
    )
    stylesheet = Path(finders.find("css/app.css")).read_text()
    pdf = HTML(string=document).write_pdf(
        stylesheets=[CSS(string=stylesheet), CSS(string=INVOICE_PAGE_CSS)]
    )
    response = HttpResponse(pdf, content_type="application/pdf")
    filename = f"invoice-{request.team.pk}-{found.number}.pdf"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
@require_POST
def topup_start(request: HttpRequest) -> HttpResponse:
    if not _can_pay(request):
        messages.error(request, "Viewers cannot top up; ask a team member or admin.")
        return redirect("billing-balance")
    if not settings.STRIPE_SECRET_KEY:
        messages.error(request, "Card payments are not configured on this server.")
        return redirect("billing-balance")
    form = TopUpForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(form.errors["amount"]))
        return redirect("billing-balance")
    return_url = request.build_absolute_uri(reverse("billing-topup-return"))
    try:
        topup = topups.topup_checkout_start(
            team_id=request.team.pk,
            amount=form.cleaned_data["amount"],
            success_url=f"{return_url}?session_id={{CHECKOUT_SESSION_ID}}",
            cancel_url=request.build_absolute_uri(reverse("billing-topup-cancel")),
            created_by_id=request.user.pk,
        )
    except BillingError as error:
        messages.error(request, str(error))
        return redirect("billing-balance")
    return redirect(topup.checkout_url)


@login_required
def topup_return(request: HttpRequest) -> HttpResponse:
    topup = team_object_or_404(
        request.team, TopUp.objects.all(), checkout_session_id=request.GET.get("session_id", "")
    )
    context = {
        "topup": topup,
        "balance": selectors.balance_from_accounts(
            team_objects(request.team, Account.objects.all())
        ),
        "waiting": topup.status in (TopUpStatus.PENDING, TopUpStatus.PROCESSING),
    }
    template = "billing/_topup_status.html" if request.headers.get("HX-Request") else None
    return render(request, template or "billing/topup_return.html", context)


@login_required
def topup_cancel(request: HttpRequest) -> HttpResponse:
    messages.info(request, "Top-up cancelled; nothing was charged.")
    return redirect("billing-balance")


@login_required
@require_POST
def test_credit(request: HttpRequest) -> HttpResponse:
    """DEBUG without Stripe keys only: a clearly labelled button that grants test credit."""
    if not settings.TEST_CREDIT_ENABLED:
        raise Http404
    if not _can_pay(request):
        messages.error(request, "Viewers cannot add credit.")
        return redirect("billing-balance")
    amount = settings.BILLING_TEST_CREDIT_AMOUNT
    credits.credit_grant(
        team_id=request.team.pk,
        amount=amount,
        reason=f"Test credit (DEBUG) by {request.user.username}",
        # One grant per form render: a double-submitted form credits once.
        idempotency_key=f"test-credit:{request.POST.get('nonce') or uuid.uuid4()}",
        created_by_id=request.user.pk,
    )
    messages.success(request, f"Added {format_amount(amount)} of test credit.")
    return redirect("billing-balance")


def _machine_id(reference: object) -> int | None:
    tail = str(reference).removeprefix(money_names.MACHINE_PREFIX)
    return int(tail) if tail.isdigit() else None


@login_required
def earnings(request: HttpRequest) -> HttpResponse:
    entries = _entries(request)
    since = timezone.localdate().replace(day=1) if request.GET.get("period") == "month" else None
    by_machine = selectors.earnings_by_machine(entries, since=since)
    by_day = selectors.earnings_by_day(entries, since=since)[:60]
    earnings_account = team_objects(request.team, Account.objects.filter(kind="earnings")).first()
    names = money_names.machine_names(request.team, (str(row.key) for row in by_machine))
    context = {
        "by_machine": [(row, names.get(str(row.key)), _machine_id(row.key)) for row in by_machine],
        "by_day": by_day,
        "totals": {
            "gross": sum(r.gross for r in by_machine),
            "fee": sum(r.fee for r in by_machine),
            "net": sum(r.net for r in by_machine),
        },
        "balance": earnings_account.balance if earnings_account else 0,
        "paid_out": selectors.earnings_paid_out(entries),
        "fee_percent": settings.PLATFORM_FEE_PERCENT,
        "period": "month" if since else "all",
        "max_day": max([r.gross for r in by_day] + [1]),
    }
    return render(request, "billing/earnings.html", context)


urlpatterns: list = [
    path("billing/", balance, name="billing-balance"),
    path("billing/ledger.csv", ledger_csv, name="billing-ledger-csv"),
    path("billing/invoices/", invoices, name="billing-invoices"),
    path("billing/invoices/<str:month>/", invoice, name="billing-invoice"),
    path("billing/invoices/<str:month>/pdf/", invoice_pdf, name="billing-invoice-pdf"),
    path("billing/topup/", topup_start, name="billing-topup"),
    path("billing/topup/return/", topup_return, name="billing-topup-return"),
    path("billing/topup/cancel/", topup_cancel, name="billing-topup-cancel"),
    path("billing/test-credit/", test_credit, name="billing-test-credit"),
    path("billing/stripe/webhook/", stripe_webhook, name="stripe-webhook"),
    path("earnings/", earnings, name="earnings"),
]
