"""Template filters for the console."""

from __future__ import annotations

import re

from django import template
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from billing.money import format_usd
from scheduler.models import InstanceState

register = template.Library()


@register.filter
def usd(micro: int | None) -> str:
    """Micro-dollars as ``$1.25``."""
    return format_usd(int(micro or 0))


@register.filter
def percent(value: float | None) -> str:
    return f"{(value or 0) * 100:.1f}%"


STATE_BADGES = {
    InstanceState.LAUNCHING: "info",
    InstanceState.RUNNING: "ok",
    InstanceState.PAUSED: "info",
    InstanceState.EXITED: "warn",
    InstanceState.UNKNOWN: "warn",
    InstanceState.STOPPING: "info",
    InstanceState.STOPPED: "",
    InstanceState.FAILED: "bad",
    InstanceState.EXPIRED: "warn",
    InstanceState.DESTROYING: "info",
    InstanceState.DESTROYED: "",
}


@register.filter
def state_badge(state: str) -> str:
    return STATE_BADGES.get(state, "")


@register.filter
def breakable(text: object) -> str:
    """Long names (host addresses, image references) may wrap after a dot, @, colon or slash
    on a narrow screen, never inside a word: an escaped copy with <wbr> after each."""
    parts = re.split(r"(?<=[.@:/])", str(text))
    return format_html_join(SafeString("<wbr>"), "{}", ((part,) for part in parts))
