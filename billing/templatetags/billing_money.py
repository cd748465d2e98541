"""Template filters for money: ``{{ micro|usd }}`` and ``{{ micro|signed_usd }}``."""

from __future__ import annotations

from typing import SupportsInt

from django import template

from billing.money import format_usd

register = template.Library()


@register.filter
def usd(micro: SupportsInt | str | None) -> str:
    if micro is None or micro == "":
        return "—"
    return format_usd(int(micro))


@register.filter
def signed_usd(micro: SupportsInt | str | None) -> str:
    if micro is None or micro == "":
        return "—"
    amount = int(micro)
    return f"+{format_usd(amount)}" if amount > 0 else format_usd(amount)


@register.filter
def percent_of_max(value: SupportsInt | str, maximum: SupportsInt | str) -> str:
    """Width of a bar, 0–100, for simple inline bar charts."""
    try:
        return f"{max(0.0, min(100.0, 100 * int(value) / max(int(maximum), 1))):.1f}"
    except (TypeError, ValueError):
        return "0"
