"""The console's SVG charts as geometry: views hand over data (points, rows), the chart tags
(``marketplace/templatetags/charts.py``) turn it into coordinates here, and the templates
under ``templates/charts/`` draw them. Pure functions: no request, no query.

Every chart has three grid lines (zero, half and the top of its scale) labelled on the left;
the bar charts give each point one slot of equal width along the x axis."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

from billing.money import format_amount

if TYPE_CHECKING:
    from billing.selectors import BalancePoint, EarningsRow
    from hosts.selectors import HourPoint

GRID_SHARES = (0, 0.5, 1)  # where the grid lines sit, as shares of the scale
MIN_BAR = 1.5  # a bar is never thinner or shorter than this, so an hour at 0% stays visible
EMPTY_EARNINGS_SCALE = 1_000_000  # the axis of a chart with no charges: $0 to $1


@dataclass(frozen=True)
class Frame:
    """An SVG viewBox and the plot area inside it (margins hold the axis labels)."""

    width: int
    height: int
    left: int
    top: int
    bottom: int
    right: int = 0
    label_gap: int = 4  # between the y-axis labels and the plot

    @property
    def plot_width(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_height(self) -> int:
        return self.height - self.top - self.bottom

    @property
    def baseline(self) -> int:
        return self.top + self.plot_height

    def y(self, share: float) -> float:
        """The y coordinate of ``share`` (0..1) of the scale."""
        return round(self.top + self.plot_height * (1 - share), 1)

    def grid(self, label: Callable[[float], str]) -> list[dict[str, Any]]:
        return [{"y": self.y(share), "label": label(share)} for share in GRID_SHARES]

    def chart(self, grid: list[dict[str, Any]], **drawn: Any) -> dict[str, Any]:
        """What a chart template reads: the frame, its grid lines and what is drawn on it."""
        return {
            "width": self.width,
            "height": self.height,
            "left": self.left,
            "right": self.width - self.right,
            "label_x": self.left - self.label_gap,
            "grid": grid,
            **drawn,
        }


# The machine page's bar charts: one row of 24 hours, or of 30 days, side by side.
HOURLY = Frame(width=560, height=130, left=34, top=6, bottom=16)
DAILY_USD = Frame(width=560, height=130, left=44, top=6, bottom=16)
BALANCE = Frame(width=640, height=180, left=64, top=10, bottom=24, right=8, label_gap=6)

LABELS_PER_AXIS = 6  # at most about this many x-axis labels, so they never overlap


@dataclass(frozen=True)
class Slot:
    """The place of one bar along the x axis."""

    x: float
    width: float
    show_label: bool


def bar_slots(frame: Frame, count: int) -> list[Slot]:
    """``count`` slots of equal width across the plot, a 1-unit gap on each side of a bar."""
    step = frame.plot_width / count
    every = max(count // LABELS_PER_AXIS, 1)
    return [
        Slot(
            x=round(frame.left + i * step + 1, 1),
            width=round(max(step - 2, MIN_BAR), 1),
            show_label=i % every == 0,
        )
        for i in range(count)
    ]


def bar_top(frame: Frame, height: float) -> float:
    """The y coordinate of the top of a bar ``height`` tall standing on the baseline."""
    return round(frame.baseline - height, 1)


def hourly_share_chart(
    points: Sequence[HourPoint], value: Callable[[HourPoint], float], *, bad_below: float = -1.0
) -> dict[str, Any]:
    """One bar per hour of ``value(point)``, a share from 0 to 1; an hour under
    ``bad_below`` is drawn as bad. Grid lines at 0, 50 and 100%."""
    frame = HOURLY
    grid = frame.grid(lambda share: f"{int(share * 100)}%")
    if not points:
        return frame.chart(grid, bars=[])
    bars = []
    for point, slot in zip(points, bar_slots(frame, len(points)), strict=True):
        share = min(max(value(point), 0.0), 1.0)
        height = max(share * frame.plot_height, MIN_BAR)
        bars.append({
            "x": slot.x, "w": slot.width, "y": bar_top(frame, height), "h": round(height, 1),
            "label": point.label, "show_label": slot.show_label, "share": round(share * 100),
            "samples": point.samples, "gpus": point.gpus, "bad": share < bad_below,
        })  # fmt: skip
    return frame.chart(grid, bars=bars)


def daily_earnings_chart(rows: Sequence[EarningsRow]) -> dict[str, Any]:
    """One bar per day of gross charges, its platform fee drawn as the bar's top part; grid
    lines at $0, half and a round top above the largest day. No charges at all: no bars."""
    frame = DAILY_USD
    top = max([row.gross for row in rows] + [0])
    scale = nice_ceiling(top) if top else EMPTY_EARNINGS_SCALE
    grid = frame.grid(lambda share: format_amount(int(scale * share)))
    if not top:
        return frame.chart(grid, bars=[])
    bars = []
    for row, slot in zip(rows, bar_slots(frame, len(rows)), strict=True):
        gross_h = row.gross / scale * frame.plot_height
        bars.append({
            "x": slot.x, "w": slot.width, "y": bar_top(frame, gross_h), "h": round(gross_h, 1),
            "fee_h": round(row.fee / scale * frame.plot_height, 1),
            "label": f"{row.key:%m-%d}", "show_label": slot.show_label,
            "gross": format_amount(row.gross), "fee": format_amount(row.fee),
            "net": format_amount(row.net), "empty": not row.gross,
        })  # fmt: skip
    return frame.chart(grid, bars=bars)


def daily_spend_chart(days: Sequence[tuple[date, int]]) -> dict[str, Any]:
    """One bar per day of usage charged (day, micro-dollars); grid lines at $0, half and a
    round top above the largest day. Nothing charged in the days shown: no bars."""
    frame = DAILY_USD
    top = max([amount for _, amount in days] + [0])
    scale = nice_ceiling(top) if top else EMPTY_EARNINGS_SCALE
    grid = frame.grid(lambda share: format_amount(int(scale * share)))
    if not top:
        return frame.chart(grid, bars=[])
    bars = []
    for (day, amount), slot in zip(days, bar_slots(frame, len(days)), strict=True):
        height = amount / scale * frame.plot_height
        bars.append({
            "x": slot.x, "w": slot.width, "y": bar_top(frame, height), "h": round(height, 1),
            "label": f"{day:%m-%d}", "show_label": slot.show_label,
            "amount": format_amount(amount), "empty": not amount,
        })  # fmt: skip
    return frame.chart(grid, bars=bars)


@dataclass(frozen=True)
class FigurePoint:
    """One measurement of a figure: its label on the x axis, its value (None: the run that
    should have measured it failed, drawn as a bad mark at the baseline) and a title."""

    label: str
    value: float | None
    title: str


FIGURES = Frame(width=560, height=130, left=44, top=6, bottom=16)


def figure_history_chart(
    points: Sequence[FigurePoint], *, top: float | None = None
) -> dict[str, Any]:
    """One bar per measurement, oldest first, on a round scale above the largest (or ``top``);
    a failed one is a thin bad bar. Grid lines at 0, half and the top."""
    frame = FIGURES
    largest = max([p.value for p in points if p.value is not None] + [0.0])
    scale = top if top is not None else nice_ceiling(math.ceil(largest) or 1)
    grid = frame.grid(lambda share: f"{scale * share:g}")
    if not points:
        return frame.chart(grid, bars=[])
    bars = []
    for point, slot in zip(points, bar_slots(frame, len(points)), strict=True):
        share = min(max((point.value or 0.0) / scale, 0.0), 1.0)
        height = max(share * frame.plot_height, MIN_BAR)
        bars.append({
            "x": slot.x, "w": slot.width, "y": bar_top(frame, height), "h": round(height, 1),
            "label": point.label, "show_label": slot.show_label, "title": point.title,
            "bad": point.value is None,
        })  # fmt: skip
    return frame.chart(grid, bars=bars)


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 × 10^k at or above ``value``: a round top for an axis."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if factor * magnitude >= value:
                return factor * magnitude
        magnitude *= 10


def balance_chart(points: Sequence[BalancePoint]) -> dict[str, Any]:
    """Two lines over the days: available credit (its area filled) and the total, available
    plus held. The scale's top is the highest total; the first, middle and last days are
    labelled. ``empty`` when the team never had credit in the period."""
    frame = BALANCE
    peak = max([p.available + p.held for p in points] + [1])
    last = max(len(points) - 1, 1)

    def x(index: int) -> float:
        return frame.left + frame.plot_width * index / last

    def line(values: list[int]) -> str:
        return " ".join(f"{x(i):.1f},{frame.y(v / peak):.1f}" for i, v in enumerate(values))

    available = line([p.available for p in points])
    area = f"{frame.left},{frame.baseline} {available} {x(last):.1f},{frame.baseline}"
    labelled = sorted({0, len(points) // 2, len(points) - 1} & set(range(len(points))))
    return frame.chart(
        frame.grid(lambda share: format_amount(round(peak * share))),
        total=line([p.available + p.held for p in points]),
        available=available,
        area=area,
        days=[{"x": f"{x(i):.1f}", "label": points[i].day.strftime("%b %-d")} for i in labelled],
        empty=all(p.available + p.held == 0 for p in points),
    )
