"""A ledger check cheap enough to run on a schedule: the gauge ``gpumkt_ledger_consistent``.

billing/ has no run-time check of its own; the whole-ledger one in
tests/billing/ledger_checks.py reads every transfer and hold, which grows with the ledger's
history. This one reads only what stays small (one row per account, the open holds) and
checks the invariants a bug in holds or metering would break first:

- credit is conserved: every transfer sums to zero, so all balances together sum to zero
  (the sources, card payments and grants, run negative by what came in);
- each team's held account is exactly what its open holds still hold;
- no account other than the two sources is negative.

That each transfer balances is enforced on insert by the ledger's triggers
(billing/migrations/0002_ledger_guards.py), so it is not read again here. The result is cached
for ``METRICS_LEDGER_CHECK_SECONDS`` in the shared cache, so however many processes are
scraped however often, the check runs about once a period.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from django.conf import settings
from django.core.cache import cache
from django.db.models import F, Sum
from django.utils import timezone

from billing.models import SOURCE_ACCOUNT_KINDS, Account, AccountKind, Hold, HoldStatus

logger = logging.getLogger(__name__)

CACHE_KEY = "observability:ledger-check"
TEAMS_NAMED = 5


@dataclass(frozen=True)
class LedgerCheck:
    problems: list[str]
    checked_at: float  # Unix time
    seconds: float

    @property
    def consistent(self) -> bool:
        return not self.problems


def ledger_problems() -> list[str]:
    """The broken invariants, in words (empty: the ledger is consistent)."""
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
    # A few examples are enough to start looking; a line per team would flood the log.
    for team_id in off[:TEAMS_NAMED]:
        problems.append(
            f"team {team_id}: held account {held_accounts.get(team_id, 0)}, "
            f"open holds {still_held.get(team_id, 0)}"
        )
    if len(off) > TEAMS_NAMED:
        problems.append(f"{len(off) - TEAMS_NAMED} more teams whose held account is off")
    negative = Account.objects.exclude(kind__in=SOURCE_ACCOUNT_KINDS).filter(balance__lt=0).count()
    if negative:
        problems.append(f"{negative} accounts below zero")
    return problems


def ledger_check_run() -> LedgerCheck:
    started = time.perf_counter()
    problems = ledger_problems()
    if problems:
        logger.error("ledger check failed: %s", "; ".join(problems))
    return LedgerCheck(
        problems=problems,
        checked_at=timezone.now().timestamp(),
        seconds=time.perf_counter() - started,
    )


def ledger_check_recent() -> LedgerCheck:
    """The last result if it is younger than the period, else a new one (cached)."""
    try:
        cached = cache.get(CACHE_KEY)
    except Exception:  # the cache is down: check anyway (a few small queries)
        logger.warning("ledger check: cache unreachable", exc_info=True)
        return ledger_check_run()
    if cached is not None:
        return LedgerCheck(**cached)
    result = ledger_check_run()
    try:
        cache.set(CACHE_KEY, asdict(result), timeout=settings.METRICS_LEDGER_CHECK_SECONDS)
    except Exception:
        logger.warning("ledger check: could not cache the result", exc_info=True)
    return result
