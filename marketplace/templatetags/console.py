"""Template filters for the console."""

from __future__ import annotations

from django import template

from billing.money import format_usd

register = template.Library()


@register.filter
def usd(micro: int | None) -> str:
    """Micro-dollars as ``$1.25``."""
    return format_usd(int(micro or 0))


@register.filter
def percent(value: float | None) -> str:
    return f"{(value or 0) * 100:.1f}%"


STATE_BADGES = {
    "launching": "info", "running": "ok", "exited": "warn", "stopping": "info", "stopped": "",
    "failed": "bad", "expired": "warn", "destroying": "info", "destroyed": "",
}  # fmt: skip


@register.filter
def state_badge(state: str) -> str:
    return STATE_BADGES.get(state, "")
