"""The template filters for money, on every page (the console's library registers these same
functions): amounts people add up — balances, holds, costs, totals, ledger rows, earnings —
to the cent (``usd``, ``signed_usd``); prices per GPU-hour, hour or GB-month exact to the
micro-dollar (``rate``), as usage is charged per second at them. The API and CSV exports keep
exact amounts (``micro_to_decimal_str``)."""

from __future__ import annotations

from typing import SupportsInt

from django import template

from billing.money import format_amount, format_usd

register = template.Library()


@register.filter
def usd(micro: SupportsInt | str | None) -> str:
    """An amount, to the cent: ``$499.53`` (``<$0.01`` for a non-zero sub-cent amount)."""
    if micro is None or micro == "":
        return "—"
    return format_amount(int(micro))


@register.filter
def rate(micro: SupportsInt | str | None) -> str:
    """A price per GPU-hour, hour or GB-month, exact: ``$0.85``, ``$0.000125``."""
    if micro is None or micro == "":
        return "—"
    return format_usd(int(micro))


@register.filter
def signed_usd(micro: SupportsInt | str | None) -> str:
    if micro is None or micro == "":
        return "—"
    amount = int(micro)
    return f"+{format_amount(amount)}" if amount > 0 else format_amount(amount)


@register.filter
def percent_of_max(value: SupportsInt | str, maximum: SupportsInt | str) -> str:
    """Width of a bar, 0–100, for simple inline bar charts."""
    try:
        return f"{max(0.0, min(100.0, 100 * int(value) / max(int(maximum), 1))):.1f}"
    except (TypeError, ValueError):
        return "0"
