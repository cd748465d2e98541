"""The gauge ``gpumkt_ledger_consistent``: billing's cheap ledger check
(``billing.selectors.ledger_problems``), timed and cached.

The result is cached for ``METRICS_LEDGER_CHECK_SECONDS`` in the shared cache, so however
many processes are scraped however often, the check runs about once a period.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from billing.selectors import ledger_problems

logger = logging.getLogger(__name__)

CACHE_KEY = "observability:ledger-check"


@dataclass(frozen=True)
class LedgerCheck:
    problems: list[str]
    checked_at: float  # Unix time
    seconds: float

    @property
    def consistent(self) -> bool:
        return not self.problems


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
