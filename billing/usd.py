"""How micro-dollars are written out: the units and the two formats (pages, CSV/API).

A leaf of the billing room (it imports nothing of ours), so that ``errors`` can word its
messages in dollars while ``money``, which raises those errors, builds on both.
"""

from __future__ import annotations

MICRO_PER_DOLLAR = 1_000_000
MICRO_PER_CENT = 10_000


def format_amount(micro: int) -> str:
    """An amount as people read totals and balances: to the cent (half up), ``$1,234.50``.
    A non-zero amount under half a cent is ``<$0.01`` (``−<$0.01``), never a free-looking
    ``$0.00``; the exact figure stays in the API and exports (``micro_to_decimal_str``)."""
    micro = int(micro)
    sign = "−" if micro < 0 else ""
    cents = abs(to_cents(micro))
    if cents == 0 and micro != 0:
        return f"{sign}<$0.01"
    whole, cent = divmod(cents, 100)
    return f"{sign}${whole:,}.{cent:02d}"


def to_cents(micro: int) -> int:
    """An amount in whole cents, half a cent rounding away from zero (as ``format_amount``)."""
    cents = (abs(int(micro)) + MICRO_PER_CENT // 2) // MICRO_PER_CENT
    return -cents if micro < 0 else cents


def format_usd(micro: int) -> str:
    """A rate, exact: ``$1,234.50``; sub-cent digits kept (``$0.000125`` a GPU-hour), as usage
    is charged per second at that rate. Amounts people total are ``format_amount``."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(int(micro)), MICRO_PER_DOLLAR)
    digits = f"{frac:06d}".rstrip("0")
    digits = digits.ljust(2, "0")
    return f"{sign}${whole:,}.{digits}"


def micro_to_decimal_str(micro: int) -> str:
    """``12.5`` → ``"12.500000"``: the exact amount as a decimal string (CSV, API)."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(int(micro)), MICRO_PER_DOLLAR)
    return f"{sign}{whole}.{frac:06d}"
