"""Template filters for the console."""

from __future__ import annotations

import re
from datetime import timedelta

from django import template
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from billing.templatetags import billing_money
from hosts.countries import country_name
from scheduler.models import InstanceState

register = template.Library()


# Money: the billing room's filters, the same functions on every page (``billing_money``).
register.filter("usd", billing_money.usd)
register.filter("rate", billing_money.rate)


@register.filter
def country(code: str | None) -> str:
    """A region's country code as its name: "DE" → "Germany" (other text as it is)."""
    return country_name(code or "")


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


@register.filter
def duration(span: timedelta | None) -> str:
    """A length of time as people say it: "45 s", "12 min", "3 h 5 min", "2 d 4 h"."""
    seconds = int(span.total_seconds()) if span else 0
    if seconds < 60:
        return f"{seconds} s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours < 1:
        return f"{minutes} min"
    if days < 1:
        return f"{hours} h {minutes % 60} min" if minutes % 60 else f"{hours} h"
    return f"{days} d {hours % 24} h" if hours % 24 else f"{days} d"
