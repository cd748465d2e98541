"""Reads of the money that take thought.

Functions that serve a request take querysets the caller already scoped to the acting team
(``marketplace.tenancy.team_objects``): billing never decides who may see what. Functions
that take a ``team_id`` are for internal callers (the rental flow, receivers).
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import NamedTuple

from django.db.models import Case, Count, F, Max, Min, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Coalesce, TruncDate, TruncMonth
from django.utils import timezone

from billing.models import (
    SOURCE_ACCOUNT_KINDS,
    Account,
    AccountKind,
    ChargeUsage,
    Entry,
    Hold,
    HoldStatus,
    PayoutRequest,
    PayoutStatus,
    TransferKind,
    UsageKind,
)


class Balance(NamedTuple):
    available: int
    held: int

    @property
    def total(self) -> int:
        return self.available + self.held


def balance_from_accounts(accounts: QuerySet[Account]) -> Balance:
    """A team's balance from its (already team-scoped) accounts."""
    found = dict(
        accounts.filter(kind__in=[AccountKind.AVAILABLE, AccountKind.HELD]).values_list(
            "kind", "balance"
        )
    )
    return Balance(found.get(AccountKind.AVAILABLE, 0), found.get(AccountKind.HELD, 0))


def team_balance(team_id: int) -> Balance:
    return balance_from_accounts(Account.objects.filter(team_id=team_id))


def team_earnings_balance(team_id: int) -> int:
    return (
        Account.objects.filter(team_id=team_id, kind=AccountKind.EARNINGS)
        .values_list("balance", flat=True)
        .first()
        or 0
    )


def teams_balances(team_ids: list[int]) -> dict[int, tuple[Balance, int]]:
    """Each team's balance and earnings, in one query for any number of teams."""
    found: dict[int, dict[str, int]] = {team_id: {} for team_id in team_ids}
    rows = Account.objects.filter(
        team_id__in=team_ids,
        kind__in=[AccountKind.AVAILABLE, AccountKind.HELD, AccountKind.EARNINGS],
    ).values_list("team_id", "kind", "balance")
    for team_id, kind, balance in rows:
        found[team_id][kind] = balance
    return {
        team_id: (
            Balance(kinds.get(AccountKind.AVAILABLE, 0), kinds.get(AccountKind.HELD, 0)),
            kinds.get(AccountKind.EARNINGS, 0),
        )
        for team_id, kinds in found.items()
    }


def team_low_balance(team_id: int, needed: int) -> bool:
    """True when the team's available credit would not cover ``needed`` (e.g. the next
    extension of a running rental)."""
    return team_balance(team_id).available < needed


# --- the ledger ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerFilter:
    start: date | None = None
    end: date | None = None  # inclusive
    kind: str = ""
    reference: str = ""
    # What ``reference`` names, when the caller resolved it (references of the team's own
    # rentals and machines bearing that name, as iterables or subqueries): rows of those
    # match too, so a person finds rows by the names the page shows.
    named_references: Iterable[str] | None = None
    named_machine_references: Iterable[str] | None = None


def day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())


def ledger_entries(entries: QuerySet[Entry], filters: LedgerFilter) -> QuerySet[Entry]:
    """Entries of the team's own accounts, newest first, narrowed by ``filters``."""
    query = entries.select_related("transfer").order_by("-created_at", "-id")
    if filters.start:
        query = query.filter(created_at__gte=day_start(filters.start))
    if filters.end:
        query = query.filter(created_at__lt=day_start(filters.end + timedelta(days=1)))
    if filters.kind:
        query = query.filter(transfer__kind=filters.kind)
    if filters.reference:
        found = Q(transfer__reference__icontains=filters.reference.strip())
        if filters.named_references is not None:
            found |= Q(transfer__reference__in=filters.named_references)
        if filters.named_machine_references is not None:
            found |= Q(transfer__machine_reference__in=filters.named_machine_references)
        query = query.filter(found)
    return query


# A hold's placing, extension, release or void moves credit between the renter's available
# and held accounts: two legs of one event. People read it as one row.
HOLD_MOVES = (TransferKind.HOLD, TransferKind.HOLD_EXTEND, TransferKind.RELEASE, TransferKind.VOID)


def ledger_rows(entries: QuerySet[Entry], filters: LedgerFilter) -> QuerySet[Entry]:
    """The ledger as the renter's page lists it: ``ledger_entries`` with one row per hold
    event (its available-account leg, which carries the balance people spend from); the
    held leg mirrors it. The export and the API list every entry."""
    return ledger_entries(entries, filters).exclude(
        account_kind=AccountKind.HELD, transfer__kind__in=HOLD_MOVES
    )


# --- balance over time ---------------------------------------------------------------------


class BalancePoint(NamedTuple):
    day: date
    available: int
    held: int


def balance_series(entries: QuerySet[Entry], *, days: int = 30) -> list[BalancePoint]:
    """The team's available and held balance at the end of each of the last ``days`` days.

    One row per (account, day) — the last entry of the day carries the balance after it —
    so the cost does not grow with the number of charges.
    """
    today = timezone.localdate()
    first = today - timedelta(days=days - 1)
    scoped = entries.filter(account_kind__in=[AccountKind.AVAILABLE, AccountKind.HELD])
    last_ids = (
        scoped.filter(created_at__gte=day_start(first))
        .annotate(day=TruncDate("created_at"))
        .values("account_kind", "day")
        .annotate(last_id=Max("id"))
        .values_list("last_id", flat=True)
    )
    by_day: dict[tuple[str, date], int] = {}
    for kind, created_at, balance in Entry.objects.filter(pk__in=list(last_ids)).values_list(
        "account_kind", "created_at", "balance_after"
    ):
        by_day[(kind, timezone.localdate(created_at))] = balance
    # The balance before the window starts: the last entry before it, per account kind.
    carried = {AccountKind.AVAILABLE: 0, AccountKind.HELD: 0}
    for kind in carried:
        before = (
            scoped.filter(account_kind=kind, created_at__lt=day_start(first))
            .order_by("-id")
            .values_list("balance_after", flat=True)
            .first()
        )
        carried[kind] = before or 0
    points = []
    for offset in range(days):
        day = first + timedelta(days=offset)
        for kind in carried:
            carried[kind] = by_day.get((kind, day), carried[kind])
        points.append(BalancePoint(day, carried[AccountKind.AVAILABLE], carried[AccountKind.HELD]))
    return points


# --- invoices ------------------------------------------------------------------------------


class InvoiceLine(NamedTuple):
    reference: str
    usage_kind: str
    amount: int
    # Usage charges that charged this kind: a charge covering GPU time and storage (one per
    # hold and metering sweep) counts on both its lines; ``Invoice.charges`` counts it once.
    charges: int
    first_at: datetime
    last_at: datetime

    @property
    def usage_label(self) -> str:
        return UsageKind(self.usage_kind).label if self.usage_kind else "Other"


@dataclass(frozen=True)
class Invoice:
    month: date  # first day of the month
    lines: list[InvoiceLine]
    credit_added: int
    charges: int = 0  # usage charges in the month, each counted once

    @property
    def number(self) -> str:
        return f"{self.month:%Y%m}"

    @property
    def total(self) -> int:
        return sum(line.amount for line in self.lines)

    @property
    def line_charges(self) -> int:
        """The lines' charge counts added up (more than ``charges`` when charges combined
        GPU time and storage)."""
        return sum(line.charges for line in self.lines)

    @property
    def period_end(self) -> date:
        return self.month.replace(day=calendar.monthrange(self.month.year, self.month.month)[1])


def _charges(entries: QuerySet[Entry]) -> QuerySet[Entry]:
    """Usage charges as the renter sees them: the held-account leg of each capture."""
    return entries.filter(account_kind=AccountKind.HELD, transfer__kind=TransferKind.CAPTURE)


def invoice_months(entries: QuerySet[Entry]) -> list[tuple[date, int]]:
    """(month, total charged) for every month with charges, newest first."""
    rows = (
        _charges(entries)
        .annotate(month=TruncMonth("created_at"))
        .values("month")
        .annotate(total=Sum("amount"))
        .order_by("-month")
    )
    return [(_as_date(row["month"]), -row["total"]) for row in rows]


def _as_date(value: date | datetime) -> date:
    return value.date() if isinstance(value, datetime) else value


def month_bounds(month: date) -> tuple[datetime, datetime]:
    first = month.replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    return day_start(first), day_start(following)


def _usage_parts() -> dict[str, Case]:
    """The part of a capture (via its held-account leg) charged for each usage kind: a
    single-kind capture is all that kind; a GPU time + storage capture splits by its
    ``storage_amount``; a capture without a kind is "other" ("")."""
    amount, storage = F("transfer__amount"), F("transfer__storage_amount")
    both = ChargeUsage.GPU_AND_STORAGE
    return {
        UsageKind.GPU: Case(
            When(transfer__usage_kind=UsageKind.GPU, then=amount),
            When(transfer__usage_kind=both, then=amount - storage),
            default=Value(0),
        ),
        UsageKind.STORAGE: Case(
            When(transfer__usage_kind=UsageKind.STORAGE, then=amount),
            When(transfer__usage_kind=both, then=storage),
            default=Value(0),
        ),
        "": Case(When(transfer__usage_kind="", then=amount), default=Value(0)),
    }


def invoice_for_month(entries: QuerySet[Entry], month: date) -> Invoice:
    """One line per rental reference per usage kind for the calendar month."""
    start, end = month_bounds(month)
    in_month = entries.filter(created_at__gte=start, created_at__lt=end)
    lines = []
    for usage_kind, part in _usage_parts().items():
        rows = (
            _charges(in_month)
            .annotate(part=part)
            .filter(part__gt=0)
            .values("transfer__reference")
            .annotate(
                total=Sum("part"),
                charges=Count("id"),
                first_at=Min("created_at"),
                last_at=Max("created_at"),
            )
        )
        lines += [
            InvoiceLine(
                reference=row["transfer__reference"],
                usage_kind=usage_kind,
                amount=row["total"],
                charges=row["charges"],
                first_at=row["first_at"],
                last_at=row["last_at"],
            )
            for row in rows
        ]
    lines.sort(key=lambda line: (line.reference, line.usage_kind))
    credit = (
        in_month.filter(
            account_kind=AccountKind.AVAILABLE,
            transfer__kind__in=[TransferKind.TOPUP, TransferKind.GRANT],
        ).aggregate(total=Sum("amount"))["total"]
        or 0
    )
    return Invoice(
        month=month.replace(day=1),
        lines=lines,
        credit_added=credit,
        charges=_charges(in_month).count(),
    )


# --- host earnings -------------------------------------------------------------------------


class EarningsRow(NamedTuple):
    key: str | date  # a machine reference or a day
    gross: int
    fee: int
    net: int


def _earnings(entries: QuerySet[Entry], since: date | None) -> QuerySet[Entry]:
    query = entries.filter(account_kind=AccountKind.EARNINGS, transfer__kind=TransferKind.CAPTURE)
    if since:
        query = query.filter(created_at__gte=day_start(since))
    return query


def _earnings_rows(query: QuerySet[Entry], key: str) -> list[EarningsRow]:
    """Gross and fee come from each charge's transfer, counted on its one credit to the
    provider's earnings: a charge whose fee took all of it credits the gross and debits the
    fee (see ``holds.capture_legs``), and must count once."""
    credit = Q(amount__gt=0)
    rows = query.values(key).annotate(
        gross=Coalesce(Sum("transfer__amount", filter=credit), 0),
        fee=Coalesce(Sum("transfer__fee", filter=credit), 0),
        net=Sum("amount"),
    )
    return [
        EarningsRow(
            _as_date(row[key]) if key == "day" else row[key], row["gross"], row["fee"], row["net"]
        )
        for row in rows
    ]


def earnings_by_machine(
    entries: QuerySet[Entry], *, since: date | None = None
) -> list[EarningsRow]:
    """Gross charges, platform fee and net earnings per machine reference, largest first."""
    rows = _earnings_rows(
        _earnings(entries, since).annotate(machine=F("transfer__machine_reference")), "machine"
    )
    return sorted(rows, key=lambda row: (-row.gross, str(row.key)))


def earnings_by_day(entries: QuerySet[Entry], *, since: date | None = None) -> list[EarningsRow]:
    rows = _earnings_rows(_earnings(entries, since).annotate(day=TruncDate("created_at")), "day")
    return sorted(rows, key=lambda row: row.key, reverse=True)


def earnings_paid_out(entries: QuerySet[Entry]) -> int:
    """Earnings paid out: the operator's direct payouts (from earnings) and the approved
    payout requests (from payout_pending)."""
    return -(
        entries.filter(
            account_kind__in=[AccountKind.EARNINGS, AccountKind.PAYOUT_PENDING],
            transfer__kind=TransferKind.PAYOUT,
        ).aggregate(total=Sum("amount"))["total"]
        or 0
    )


# A few teams are enough to start looking; a line per team would flood the log.
LEDGER_TEAMS_NAMED = 5


def ledger_problems() -> list[str]:
    """The broken invariants, in words (empty: the ledger is consistent).

    Cheap enough to run on a schedule (the ``gpumkt_ledger_consistent`` gauge runs it): the
    whole-ledger check in tests/billing/ledger_checks.py reads every transfer and hold, which
    grows with the ledger's history; this reads only what stays small (one row per account,
    the open holds) and checks the invariants a bug in holds or metering would break first:

    - credit is conserved: every transfer sums to zero, so all balances together sum to zero
      (the sources, card payments and grants, run negative by what came in);
    - each team's held account is exactly what its open holds still hold;
    - no account other than the two sources is negative.

    That each transfer balances is enforced on insert by the ledger's triggers
    (billing/migrations/0002_ledger_guards.py), so it is not read again here.
    """
    problems = []
    total = Account.objects.aggregate(total=Sum("balance"))["total"] or 0
    if total != 0:
        problems.append(f"balances sum to {total} micro-dollars, not 0")
    still_held = dict(
        Hold.objects.filter(status=HoldStatus.OPEN)
        .values("team_id")
        .annotate(held=Sum(F("amount") - F("captured_gpu") - F("captured_storage")))
        .values_list("team_id", "held")
    )
    held_accounts = dict(
        Account.objects.filter(kind=AccountKind.HELD).values_list("team_id", "balance")
    )
    off = [
        team_id
        for team_id in sorted(set(still_held) | set(held_accounts))
        if still_held.get(team_id, 0) != held_accounts.get(team_id, 0)
    ]
    for team_id in off[:LEDGER_TEAMS_NAMED]:
        problems.append(
            f"team {team_id}: held account {held_accounts.get(team_id, 0)}, "
            f"open holds {still_held.get(team_id, 0)}"
        )
    if len(off) > LEDGER_TEAMS_NAMED:
        problems.append(f"{len(off) - LEDGER_TEAMS_NAMED} more teams whose held account is off")
    problems.extend(_payout_pending_problems())
    negative = Account.objects.exclude(kind__in=SOURCE_ACCOUNT_KINDS).filter(balance__lt=0).count()
    if negative:
        problems.append(f"{negative} accounts below zero")
    return problems


def _payout_pending_problems() -> list[str]:
    """Each team's payout_pending account holds exactly its waiting payout request."""
    waiting = dict(
        PayoutRequest.objects.filter(status=PayoutStatus.REQUESTED).values_list("team_id", "amount")
    )
    pending = dict(
        Account.objects.filter(kind=AccountKind.PAYOUT_PENDING).values_list("team_id", "balance")
    )
    off = [
        team_id
        for team_id in sorted(set(waiting) | set(pending), key=str)
        if waiting.get(team_id, 0) != pending.get(team_id, 0)
    ]
    return [
        f"team {team_id}: payout_pending account {pending.get(team_id, 0)}, "
        f"waiting payout request {waiting.get(team_id, 0)}"
        for team_id in off[:LEDGER_TEAMS_NAMED]
    ]


def spend_by_day(entries: QuerySet[Entry], *, since: date) -> list[tuple[date, int]]:
    """(day, usage charged that day) for every day from ``since`` to today, oldest first; a
    day without charges is there with 0, so a chart of it has no gaps."""
    rows = (
        _charges(entries.filter(created_at__gte=day_start(since)))
        .annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(total=Sum("amount"))
    )
    charged = {_as_date(row["day"]): -row["total"] for row in rows}
    today = timezone.localdate()
    days = (today - since).days + 1
    return [(day, charged.get(day, 0)) for day in (since + timedelta(n) for n in range(days))]
