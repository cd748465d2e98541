"""The vast.ai money commands beyond ``show invoices``: a rental's deposit, the charges,
the invoices (credit added), and price increases.

- ``show deposit ID``: the credit held for the rental (our hold, /api/v1/billing/holds/).
- ``show invoices-v1 -c``: the usage charges, one row per rental or volume per day (what the
  console's invoices list per month); ``-i``: the credit added, as below.
- ``search invoices '<query>'``: the credit added to the team (top-ups, grants, credit sent
  between teams), each a row in vast's invoice fields, filtered by the CLI's query.
- ``show pending-price-increases``: always none. A rental's prices are fixed when it is
  rented, extensions included, so no price increase ever waits on a renter (``accept`` and
  ``reject price-increase`` then tell the user that none is pending, as the CLI does).
"""

from __future__ import annotations

import operator
from datetime import UTC, datetime
from typing import Any

from django.db.models import Count, Max, Min, Sum
from django.db.models.functions import TruncDay
from drf_spectacular.utils import extend_schema
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.response import Response

from billing.models import AccountKind, Entry, Hold, TransferKind
from billing.money import MICRO_PER_DOLLAR
from billing.usd import MICRO_PER_CENT
from marketplace.models.volumes import volume_reference
from marketplace.money_names import RENTAL_PREFIX
from marketplace.tenancy import team_objects
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, RenterView, VastView, json_param

VOLUME_PREFIX = volume_reference(0)[:-1]  # "volume:"


def dollars(micro: int) -> float:
    return micro / MICRO_PER_DOLLAR


def epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment else None


class Deposit(RenterView):
    """``vastai show deposit ID``: what the rental's hold reserved, charged and still holds."""

    @extend_schema(summary="vast.ai: show deposit", responses={200: ANY_JSON})
    def get(self, request, pk: int):
        instance = self.instance(pk)
        rental = instance.rental
        hold = team_objects(self.team, Hold.objects.all()).get(pk=rental.hold_id)
        return Response(
            {
                "success": True,
                "instance_id": instance.pk,
                # What the hold still reserves: usage from now on is charged from it, and
                # what is left comes back when the rental ends.
                "deposit": dollars(hold.remaining),
                "held_total": dollars(hold.amount),
                "charged": dollars(hold.captured),
                "charged_gpu": dollars(hold.captured_gpu),
                "charged_storage": dollars(hold.captured_storage),
                "released": dollars(hold.released),
                "status": hold.status,
                "covers_until": epoch(rental.ends_at),
                "hold_id": hold.pk,
            }
        )


# --- charges (show invoices-v1 -c) -------------------------------------------------------------


def charge_type(reference: str) -> tuple[str, str] | None:
    """(vast's charge type, its source id) for a ledger reference; None for another kind."""
    for prefix, kind in ((RENTAL_PREFIX, "instance"), (VOLUME_PREFIX, "volume")):
        if reference.startswith(prefix) and reference[len(prefix) :].isdigit():
            return kind, reference[len(prefix) :]
    return None


def time_window(filters: Any, column: str) -> tuple[datetime, datetime]:
    """``select_filters[column]`` (``gte``/``lte`` epoch seconds), as the CLI sends its
    dates (``day`` for charges, ``when`` for invoices)."""
    if not isinstance(filters, dict):
        raise Refused("select_filters is an object.", field="select_filters")
    window = filters.get(column)
    if not isinstance(window, dict):
        raise Refused(
            f"select_filters.{column} gives gte and lte, in seconds since 1970.", field=column
        )
    bounds = []
    for name in ("gte", "lte"):
        value = window.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1e11:
            raise Refused(f"{column}.{name} is a time in seconds since 1970.", field=column)
        bounds.append(datetime.fromtimestamp(value, UTC))
    return bounds[0], bounds[1]


def page_limit(request) -> int:
    limit = json_param(request, "limit") or 20
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 100:
        raise Refused("--limit is between 1 and 100.", field="limit")
    return limit


def paged(request, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A page of ``rows`` in the shape show invoices-v1 reads, from ``after_token``."""
    if json_param(request, "latest_first") is True:
        rows.reverse()
    limit, offset = page_limit(request), page_start(request.query_params.get("after_token"))
    page = rows[offset : offset + limit]
    more = offset + limit < len(rows)
    return {
        "results": page,
        "count": len(page),
        "total": len(rows),
        "next_token": str(offset + limit) if more else None,
    }


def wanted_types(filters: dict) -> set[str]:
    condition = filters.get("type")
    if condition is None:
        return {"instance", "volume", "serverless"}
    kinds = condition.get("in") if isinstance(condition, dict) else None
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise Refused("type is {'in': [instance, volume, serverless]}.", field="charge_type")
    return set(kinds)


def page_start(raw: Any) -> int:
    if raw in (None, ""):
        return 0
    if isinstance(raw, str) and raw.isdigit() and len(raw) < 10:
        return int(raw)
    raise Refused("--next-token is the token the previous page gave.", field="next_token")


class JsonWhateverFormat(DefaultContentNegotiation):
    """The CLI's ``format`` parameter (table or tree) is how it prints the answer, not DRF's
    format override (which answered an unknown format with a bare 404): always JSON."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return super().select_renderer(request, renderers, format_suffix="json")


class Charges(VastView):
    """``vastai show invoices-v1 -c``: the team's usage charges between two days, one row per
    rental (``instance``) or volume per day, a page at a time. A serverless endpoint's
    workers are rentals, so their charges are instance rows."""

    audience = "renter"
    content_negotiation_class = JsonWhateverFormat

    @extend_schema(summary="vast.ai: show invoices-v1 --charges", responses={200: ANY_JSON})
    def get(self, request):
        filters = json_param(request, "select_filters") or {}
        start, end = time_window(filters, "day")
        page_limit(request)  # refused before the work
        return Response(paged(request, self.rows(start, end, wanted_types(filters))))

    def rows(self, start, end, kinds: set[str]) -> list[dict[str, Any]]:
        # The held account's leg of each capture: what usage cost the renter.
        captures = team_objects(self.team, Entry.objects.all()).filter(
            account_kind=AccountKind.HELD,
            transfer__kind=TransferKind.CAPTURE,
            created_at__gte=start,
            created_at__lte=end,
        )
        grouped = (
            captures.annotate(day=TruncDay("created_at"))
            .values("transfer__reference", "day")
            .annotate(
                total=Sum("amount"),
                charges=Count("id"),
                first_at=Min("created_at"),
                last_at=Max("created_at"),
            )
            .order_by("day", "transfer__reference")
        )
        rows = []
        for group in grouped:
            typed = charge_type(group["transfer__reference"])
            if typed is None or typed[0] not in kinds:
                continue
            kind, source = typed
            rows.append(
                {
                    "type": kind,
                    "source": source,
                    "reference": group["transfer__reference"],
                    "amount": dollars(-group["total"]),
                    "start": epoch(group["first_at"]),
                    "end": epoch(group["last_at"]),
                    "day": epoch(group["day"]),
                    "description": f"{group['charges']} usage charge(s) of {kind} {source}",
                    "items": [],
                    "metadata": {},
                }
            )
        return rows


# --- invoices (search invoices) ----------------------------------------------------------------

SERVICES = {
    TransferKind.TOPUP: "stripe_payments",
    TransferKind.GRANT: "grant",
    TransferKind.TEAM_TRANSFER: "transfer",
}
OPERATORS = {
    "eq": operator.eq,
    "neq": operator.ne,
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
}
# The fields a query may name, and the type its values are compared as.
INVOICE_FIELDS: dict[str, type] = {
    "id": float,
    "user_id": float,
    "when": float,
    "paid_on": float,
    "amount_cents": float,
    "is_credit": bool,
    "is_delayed": bool,
    "balance_before": float,
    "balance_after": float,
    "original_amount": float,
    "service": str,
    "event_id": str,
    "failed": bool,
    "refunded": bool,
}


def invoice_row(entry: Entry) -> dict[str, Any]:
    cents = (
        entry.amount // MICRO_PER_CENT if entry.amount > 0 else -(-entry.amount // MICRO_PER_CENT)
    )
    when = entry.created_at.timestamp()
    return {
        "id": entry.pk,
        "user_id": entry.team_id,
        "when": when,
        "paid_on": when,
        "payment_expected": when,
        "amount_cents": cents,
        "original_amount": cents,
        "is_credit": entry.amount > 0,
        "is_delayed": False,
        "balance_before": dollars(entry.balance_after - entry.amount),
        "balance_after": dollars(entry.balance_after),
        "service": SERVICES[entry.transfer.kind],
        "event_id": entry.transfer.reference,
        "description": entry.transfer.description or entry.transfer.reference,
        "failed": False,
        "refunded": False,
        "is_check": False,
    }


def compared(value: Any, kind: type, name: str) -> Any:
    """A query's value as the field's type (the CLI sends numbers as text)."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise Refused(f"{name} is true or false.", field=name)
    if kind is float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise Refused(f"{name} is a number.", field=name) from None
        if number != number:  # NaN matches nothing and means nothing
            raise Refused(f"{name} is a number.", field=name)
        return number
    if not isinstance(value, str):
        raise Refused(f"{name} is text.", field=name)
    return value


def matches(row: dict[str, Any], filters: dict[str, Any]) -> bool:
    for name, conditions in filters.items():
        kind = INVOICE_FIELDS[name]
        for op, value in conditions.items():
            if op in ("in", "notin"):
                found = row[name] in [compared(v, kind, name) for v in value]
                if found != (op == "in"):
                    return False
            elif not OPERATORS[op](row[name], compared(value, kind, name)):
                return False
    return True


def invoice_filters(filters: Any) -> dict[str, dict[str, Any]]:
    if filters in (None, {}):
        return {}
    if not isinstance(filters, dict):
        raise Refused("select_filters is an object.", field="select_filters")
    for name, conditions in filters.items():
        if name not in INVOICE_FIELDS:
            raise Refused(
                f"search invoices filters by {', '.join(INVOICE_FIELDS)} here, not by {name}.",
                field=name,
            )
        if not isinstance(conditions, dict) or not conditions:
            raise Refused(f"{name}: a condition, like {{'gt': value}}.", field=name)
        for op, value in conditions.items():
            if op not in OPERATORS and op not in ("in", "notin"):
                raise Refused(f"{name}: use =, !=, <, <=, >, >=, in or notin.", field=name)
            if op in ("in", "notin") and not isinstance(value, list):
                raise Refused(f"{name} {op}: a list of values.", field=name)
            for item in value if isinstance(value, list) else [value]:
                compared(item, INVOICE_FIELDS[name], name)  # refuses a bad value up front
    return filters


MAX_INVOICES = 10_000


class InvoiceSearch(VastView):
    """``vastai search invoices '<query>'``: the credit added to the team (top-ups, grants,
    credit sent between teams: in, or out as a negative amount), oldest first."""

    @extend_schema(summary="vast.ai: search invoices", responses={200: ANY_JSON})
    def get(self, request):
        filters = invoice_filters(json_param(request, "select_filters"))
        rows = (invoice_row(entry) for entry in credit_entries(self.team)[:MAX_INVOICES])
        return Response([row for row in rows if matches(row, filters)])


def credit_entries(team):
    """The team's credit added (or sent away), oldest first."""
    return (
        team_objects(team, Entry.objects.select_related("transfer"))
        .filter(account_kind=AccountKind.AVAILABLE, transfer__kind__in=list(SERVICES))
        .order_by("pk")
    )


# show invoices-v1 -i's types: credit bought or granted, and credit sent between teams.
INVOICE_TYPES = {
    TransferKind.TOPUP: "credit",
    TransferKind.GRANT: "credit",
    TransferKind.TEAM_TRANSFER: "transfer",
}


def payment_row(entry: Entry) -> dict[str, Any]:
    kind = INVOICE_TYPES[entry.transfer.kind]
    amount = dollars(entry.amount)
    when = entry.created_at.timestamp()
    return {
        "id": entry.pk,
        "type": kind,
        "source": SERVICES[entry.transfer.kind],
        # vast sends a credit's amount negative; the CLI turns it round to show it.
        "amount": -amount if kind == "credit" else amount,
        "start": when,
        "end": when,
        "description": entry.transfer.description or entry.transfer.reference,
        "items": [],
        "metadata": {"invoice_id": entry.pk},
    }


def wanted_services(filters: dict) -> set[str] | None:
    condition = filters.get("service")
    if condition is None:
        return None
    services = condition.get("in") if isinstance(condition, dict) else None
    if not isinstance(services, list) or not all(isinstance(s, str) for s in services):
        raise Refused("service is {'in': [transfer, stripe_payments, …]}.", field="invoice_type")
    return set(services)


class PaymentInvoices(VastView):
    """``vastai show invoices-v1 -i``: the credit added to the team between two dates, as
    rows the CLI prints (it reads them at /api/v1/invoices/, a path our own API leaves free).
    ``-it transfers`` or ``stripe`` choose the kinds; a grant's service is ``grant``."""

    content_negotiation_class = JsonWhateverFormat

    @extend_schema(summary="vast.ai: show invoices-v1 --invoices", responses={200: ANY_JSON})
    def get(self, request):
        filters = json_param(request, "select_filters") or {}
        start, end = time_window(filters, "when")
        services = wanted_services(filters)
        page_limit(request)
        entries = credit_entries(self.team).filter(created_at__gte=start, created_at__lte=end)
        rows = [
            payment_row(entry)
            for entry in entries[:MAX_INVOICES]
            if services is None or SERVICES[entry.transfer.kind] in services
        ]
        return Response(paged(request, rows))


# --- price increases -------------------------------------------------------------------------


class PendingPriceIncreases(VastView):
    """``vastai show pending-price-increases``: none, ever; a rental's prices are fixed at
    renting (extensions included), so a provider's new price applies to new rentals only."""

    audience = "renter"

    @extend_schema(summary="vast.ai: show pending-price-increases", responses={200: ANY_JSON})
    def get(self, request):
        return Response(
            {"success": True, "count": 0, "truncated": False, "pending_price_increases": []}
        )


class PriceIncreaseAnswer(VastView):
    """``accept``/``reject price-increase`` of a pending row: none exists (see above), so any
    row id answers vast's own "no pending price increase" 404."""

    audience = "renter"

    @extend_schema(summary="vast.ai: accept or reject price-increase", responses={404: ANY_JSON})
    def put(self, request):
        self.body()
        return Response(
            {
                "success": False,
                "error": "no_pending_price_increase",
                "msg": "No price increase is pending: a rental's prices are fixed when it is "
                "rented.",
            },
            status=404,
        )
