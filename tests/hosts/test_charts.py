"""The chart tags draw what the pages hand them: bars for data, a sentence when there is none."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from django.template import engines

from billing.selectors import BalancePoint, EarningsRow
from hosts.selectors import HourPoint
from marketplace.charts import nice_ceiling


def render(source: str, **context) -> str:
    return engines["django"].from_string("{% load charts %}" + source).render(context)


def hours(*shares: float) -> list[HourPoint]:
    start = datetime(2027, 6, 30, tzinfo=UTC)
    return [
        HourPoint(start + timedelta(hours=i), f"{i:02d}:00", share, 120, share, 4)
        for i, share in enumerate(shares)
    ]


UPTIME = '{% hourly_share_chart points "answered" unit="answered" label="Uptime" bad_below=0.99 %}'


def test_hourly_share_chart_draws_one_bar_per_hour_and_flags_bad_hours():
    page = render(UPTIME, points=hours(1.0, 0.5, 0.0))
    assert page.count('<svg class="chart"') == 1 and 'aria-label="Uptime"' in page
    assert page.count("<rect ") == 3
    assert "00:00: 100% answered (120 heartbeats, 4 GPUs)" in page
    assert "01:00: 50% answered" in page and "02:00: 0% answered" in page
    assert page.count('class="bar-bad"') == 2 and page.count('class="bar-ok"') == 1
    assert ">0%</text>" in page and ">50%</text>" in page and ">100%</text>" in page


def test_hourly_share_chart_without_heartbeats_says_so():
    page = render(UPTIME, points=[])
    assert "<svg" not in page and "No heartbeats yet" in page


def test_daily_earnings_chart_draws_charged_days_with_their_fee_and_a_round_axis():
    rows = [
        EarningsRow(date(2027, 6, 1), 0, 0, 0),
        EarningsRow(date(2027, 6, 2), 3_000_000, 300_000, 2_700_000),
    ]
    page = render('{% daily_earnings_chart rows label="Charges" days=30 %}', rows=rows)
    assert page.count("<g><title>") == 1  # a day without charges draws no bar
    assert "06-02: $3.00 charged, $0.30 platform fee, $2.70 earned" in page
    assert 'class="bar-fee"' in page and ">$5.00</text>" in page  # 5 is the round top above 3
    assert "earned (net)" in page


def test_daily_earnings_chart_without_charges_says_so():
    rows = [EarningsRow(date(2027, 6, 1), 0, 0, 0)]
    page = render('{% daily_earnings_chart rows label="Charges" days=30 %}', rows=rows)
    assert "<svg" not in page and 'id="no-earnings"' in page and "last 30 days" in page


def test_balance_chart_draws_both_lines_and_says_when_there_was_never_credit():
    days = [BalancePoint(date(2027, 6, 1) + timedelta(days=i), i * 1_000_000, 0) for i in range(3)]
    page = render('{% balance_chart points label="Balance" %}', points=days)
    assert 'class="chart-line-total"' in page and 'class="chart-line-available"' in page
    assert ">Jun 1</text>" in page and ">Jun 3</text>" in page and ">$2.00</text>" in page
    empty = [BalancePoint(day.day, 0, 0) for day in days]
    page = render('{% balance_chart points label="Balance" %}', points=empty)
    assert "<svg" not in page and "No credit yet" in page


def test_nice_ceiling_rounds_up_to_one_two_or_five():
    assert [nice_ceiling(v) for v in (1, 3, 7, 10, 11, 2_500_001)] == [1, 5, 10, 10, 20, 5_000_000]
