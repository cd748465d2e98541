"""Money is integer micro-dollars (1 USD = 1_000_000), never float.

Charges are computed from cumulative usage and rounded once (half up), so rounding never
accumulates across captures. The units and formats live in ``billing.usd`` (which
``billing.errors`` needs too); this module is still the one door callers import them from.
"""

from __future__ import annotations

import re
from fractions import Fraction

from billing.errors import InvalidAmount
from billing.usd import (
    MICRO_PER_CENT,
    MICRO_PER_DOLLAR,
    format_amount,
    format_usd,
    micro_to_decimal_str,
)

__all__ = [
    "MICRO_PER_CENT",
    "MICRO_PER_DOLLAR",
    "PARSE_MAX_MICRO",
    "SECONDS_PER_HOUR",
    "format_amount",
    "format_usd",
    "micro_to_decimal_str",
    "parse_usd",
    "percent_of",
    "round_half_up",
    "usage_owed",
]

SECONDS_PER_HOUR = 3600
# The most a single amount typed into a form may be: a guard against typos and overflow
# (BigIntegerField holds 9.2e18 micro-dollars; this is 1e15).
PARSE_MAX_MICRO = 1_000_000_000 * MICRO_PER_DOLLAR

_USD_RE = re.compile(r"^\$?(?P<whole>\d{1,3}(?:,\d{3})+|\d+)?(?:\.(?P<frac>\d*))?$")


def round_half_up(value: Fraction) -> int:
    """The nearest integer, halves away from zero (for the non-negative amounts we round)."""
    if value < 0:
        return -round_half_up(-value)
    return int((value + Fraction(1, 2)) // 1)


def usage_owed(*, rate_per_hour: int, seconds: int) -> int:
    """What ``seconds`` of use cost at ``rate_per_hour`` micro-dollars per hour, rounded once."""
    if rate_per_hour < 0 or seconds < 0:
        raise InvalidAmount("Rate and seconds must not be negative.", field="rate_per_hour")
    # (r·s + 1800) // 3600 is r·s/3600 rounded half up, in integers only.
    return (rate_per_hour * seconds + SECONDS_PER_HOUR // 2) // SECONDS_PER_HOUR


def percent_of(amount: int, percent: Fraction) -> int:
    """``amount × percent / 100`` rounded half up, in integers only (amount ≥ 0)."""
    numerator, denominator = percent.numerator, percent.denominator * 100
    return (2 * amount * numerator + denominator) // (2 * denominator)


def parse_usd(text: str, *, field: str = "amount", max_decimals: int = 6) -> int:
    """``"12.34"``, ``"$1,000"`` → micro-dollars. Rejects negatives, NaN, exponents, more
    decimals than ``max_decimals`` and amounts over a billion dollars, with a clear message."""
    if not isinstance(text, str):
        text = str(text)
    cleaned = text.strip().replace(" ", "")
    if not cleaned:
        raise InvalidAmount("Enter an amount in dollars, for example 25 or 25.50.", field=field)
    if cleaned.startswith("-"):
        raise InvalidAmount("The amount must not be negative.", field=field)
    match = _USD_RE.match(cleaned)
    if match is None or (match["whole"] is None and not match["frac"]):
        raise InvalidAmount(
            f"{text.strip()[:40]!r} is not an amount in dollars (use digits, like 25.50).",
            field=field,
        )
    frac = match["frac"] or ""
    if len(frac) > max_decimals:
        unit = "cents" if max_decimals == 2 else f"{max_decimals} decimal places"
        raise InvalidAmount(f"Use at most {unit} (got {len(frac)} decimals).", field=field)
    whole = int((match["whole"] or "0").replace(",", ""))
    micro = whole * MICRO_PER_DOLLAR + int(frac.ljust(6, "0") or 0)
    if micro > PARSE_MAX_MICRO:
        raise InvalidAmount(
            f"The amount must be at most {format_usd(PARSE_MAX_MICRO)}.", field=field
        )
    return micro
