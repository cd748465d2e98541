"""The console's charts as inclusion tags: a page hands over its data and a label, e.g.
``{% load charts %}{% hourly_share_chart history "answered" unit="answered" label="…" %}``.
The geometry lives in ``marketplace/charts.py``, the markup in ``templates/charts/``."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from django import template

from marketplace import charts

register = template.Library()


@register.inclusion_tag("charts/hourly_share.html")
def hourly_share_chart(
    points: Sequence[Any], share: str, *, unit: str, label: str, bad_below: float = -1.0
) -> dict[str, Any]:
    """One bar per hour of the share named ``share`` (``answered``, ``utilization``); each
    bar's title reads "<hour>: <n>% <unit> (<samples> heartbeats, <gpus> GPUs)"."""
    return {
        "chart": charts.hourly_share_chart(points, attrgetter(share), bad_below=bad_below),
        "unit": unit,
        "label": label,
    }


@register.inclusion_tag("charts/daily_earnings.html")
def daily_earnings_chart(rows: Sequence[Any], *, label: str, days: int) -> dict[str, Any]:
    """One bar per day of charges, net earnings and the platform fee (``EarningsRow`` by day);
    with no charges in the ``days`` shown, a sentence says so."""
    return {"chart": charts.daily_earnings_chart(rows), "label": label, "days": days}


@register.inclusion_tag("charts/balance.html")
def balance_chart(points: Sequence[Any], *, label: str) -> dict[str, Any]:
    """Available and total credit per day (``BalancePoint``s), or a sentence when there was
    never any."""
    return {"chart": charts.balance_chart(points), "label": label}


@register.inclusion_tag("charts/daily_spend.html")
def daily_spend_chart(days: Sequence[Any], *, label: str) -> dict[str, Any]:
    """One bar per day of usage charged ((day, micro-dollars) pairs), or a sentence when
    nothing was charged in those days."""
    return {"chart": charts.daily_spend_chart(days), "label": label, "days": len(days)}


@register.inclusion_tag("charts/figure_history.html")
def figure_history_chart(
    points: Sequence[Any], *, label: str, empty: str, top: float | None = None
) -> dict[str, Any]:
    """One bar per measurement (``charts.FigurePoint``), failed ones drawn as bad; ``empty``
    is said when there is none yet."""
    return {"chart": charts.figure_history_chart(points, top=top), "label": label, "empty": empty}
