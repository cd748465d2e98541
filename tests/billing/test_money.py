from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from billing.errors import InvalidAmount
from billing.money import MICRO_PER_DOLLAR, format_usd, parse_usd, usage_owed


@pytest.mark.parametrize(
    ("rate", "seconds", "owed"),
    [
        (3_600_000, 1, 1_000),  # $3.60/h for one second is exactly 0.1 cent
        (1_000_000, 1, 278),  # 277.77… rounds up
        (1_000_000, 2, 556),  # 555.55… rounds up
        (1, 1800, 1),  # exactly half a micro-dollar rounds half up
        (1, 1799, 0),
        (0, 10_000, 0),
        (2_500_000, 3600 * 24, 60_000_000),
    ],
)
def test_usage_owed_rounds_once_half_up(rate, seconds, owed):
    assert usage_owed(rate_per_hour=rate, seconds=seconds) == owed


@given(st.integers(0, 10**9), st.integers(0, 10**8), st.integers(0, 10**8))
def test_usage_owed_is_monotonic_and_never_drifts(rate, a, b):
    low, high = sorted((a, b))
    assert usage_owed(rate_per_hour=rate, seconds=low) <= usage_owed(
        rate_per_hour=rate, seconds=high
    )
    exact = rate * high / 3600
    assert abs(usage_owed(rate_per_hour=rate, seconds=high) - exact) <= 0.5 + 1e-6 * exact


def test_usage_owed_rejects_negatives():
    with pytest.raises(InvalidAmount):
        usage_owed(rate_per_hour=-1, seconds=10)
    with pytest.raises(InvalidAmount):
        usage_owed(rate_per_hour=1, seconds=-10)


@pytest.mark.parametrize(
    ("micro", "text"),
    [
        (0, "$0.00"),
        (1_500_000, "$1.50"),
        (1_234_567_890_000, "$1,234,567.89"),
        (125, "$0.000125"),
        (-2_000_000, "-$2.00"),
        (10_000, "$0.01"),
    ],
)
def test_format_usd(micro, text):
    assert format_usd(micro) == text


@pytest.mark.parametrize(
    ("text", "micro"),
    [
        ("25", 25 * MICRO_PER_DOLLAR),
        ("25.5", 25_500_000),
        ("$1,000.25", 1_000_250_000),
        (" 0.000001 ", 1),
        (".5", 500_000),
    ],
)
def test_parse_usd_accepts_plain_amounts(text, micro):
    assert parse_usd(text) == micro


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("-5", "negative"),
        ("NaN", "not an amount"),
        ("inf", "not an amount"),
        ("1e6", "not an amount"),
        ("", "Enter an amount"),
        ("12.3456789", "at most"),
        ("1,00", "not an amount"),
        ("10000000000", "at most"),
        ("5 dollars", "not an amount"),
    ],
)
def test_parse_usd_rejects_bad_input_with_a_clear_error(text, reason):
    with pytest.raises(InvalidAmount) as caught:
        parse_usd(text)
    assert reason in str(caught.value)
    assert caught.value.fields == {"amount": [str(caught.value)]}


def test_parse_usd_in_whole_cents_for_forms():
    assert parse_usd("5.25", max_decimals=2) == 5_250_000
    with pytest.raises(InvalidAmount, match="cents"):
        parse_usd("5.255", max_decimals=2)


@given(st.integers(0, 10**15))
def test_format_then_parse_round_trips(micro):
    assert parse_usd(format_usd(micro)) == micro
