"""How micro-dollars are written out: the units and the two formats (pages, CSV/API).

A leaf of the billing room (it imports nothing of ours), so that ``errors`` can word its
messages in dollars while ``money``, which raises those errors, builds on both.
"""

from __future__ import annotations

MICRO_PER_DOLLAR = 1_000_000
MICRO_PER_CENT = 10_000


def format_usd(micro: int) -> str:
    """``$1,234.50``; sub-cent amounts keep their digits (``$0.000125``) so nothing looks free."""
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
