"""Number and money fields every API serializer uses, so one rule holds on every endpoint.

- A float input is a finite number: ``"NaN"``, ``"Infinity"``, ``1e309`` (JSON's overflow to
  infinity) and booleans are refused with a 400 naming the field, before any service sees
  them. NaN slips past ``min_value``/``max_value`` (every comparison with it is false), so a
  bound alone never catches it; this check runs first.
- Money is dollars as a decimal string in every response (``"99.768611"``: exact, never a
  float) and dollars on input (``"1.45"`` or ``1.45``); inside, it stays integer micro-dollars.
"""

from __future__ import annotations

import math
from datetime import UTC

import django_filters
from django.core.exceptions import ValidationError
from django_filters.fields import IsoDateTimeField
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.errors import InvalidAmount
from billing.money import micro_to_decimal_str, parse_usd

# Wider than any figure the platform uses (hours, prices, GB), and far inside a float's range:
# a larger magnitude is a typo or a probe, and is refused before it reaches any arithmetic.
MAX_MAGNITUDE = 1e12


def finite_number(value) -> float:
    """``value`` as a finite float, or ``ValueError`` saying why not (the caller names the
    field). Used by the API's float fields and by the console's number inputs alike."""
    if isinstance(value, bool):
        raise ValueError("Enter a number, not true or false.")
    if isinstance(value, str):
        value = value.strip()
        if len(value) > 100:
            raise ValueError("Enter a number (this text is too long to be one).")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError("Enter a number.") from None
    if not math.isfinite(number):
        raise ValueError(f"Enter a finite number ({str(value)[:20]!r} is not one).")
    if abs(number) > MAX_MAGNITUDE:
        raise ValueError(f"Enter a number between {-MAX_MAGNITUDE:g} and {MAX_MAGNITUDE:g}.")
    return number


def clamped_whole(value, low: int, high: int) -> int:
    """A count where any number is a fair request, brought within ``low``..``high``
    (``tail=-1`` is 1 line, ``tail=10**30`` is ``high``; a JSON 12.5 is 12); ``ValueError``
    for what is not a number at all (other text, NaN, infinity, true/false, lists)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("Enter a whole number.")
    if isinstance(value, str):
        value = value.strip()
        if not (value.lstrip("+-").isascii() and value.lstrip("+-").isdigit()):
            raise ValueError("Enter a whole number.")
        value = int(value)  # past 4300 digits Python refuses: a ValueError too
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("Enter a whole number.")
        value = int(value)
    return min(max(value, low), high)


class FiniteFloatField(serializers.FloatField):
    """A float field that refuses NaN, ±Infinity, overflowing exponents and booleans."""

    def to_internal_value(self, data):
        try:
            return finite_number(data)
        except ValueError as error:
            raise serializers.ValidationError(str(error), code="invalid") from None


def dollars(micro: int | None) -> str | None:
    """Micro-dollars as a dollar decimal string, the API's one unit for money."""
    return None if micro is None else micro_to_decimal_str(micro)


DOLLARS_SCHEMA = {
    "type": "string",
    "format": "decimal",
    "pattern": r"^-?\d+(\.\d{1,6})?$",
    "example": "1.450000",
    "description": "US dollars as a decimal string (up to 6 decimals).",
}


@extend_schema_field(DOLLARS_SCHEMA)
class DollarsField(serializers.Field):
    """Money: integer micro-dollars inside; a dollar decimal string outside (``"1.450000"``).

    Input is dollars, as a string (``"1.45"``) or a JSON number (``1.45``); negatives,
    exponents, NaN, more than 6 decimals and over a billion dollars answer 400 naming the
    field."""

    def __init__(self, *, max_decimals: int = 6, **kwargs):
        self.max_decimals = max_decimals
        super().__init__(**kwargs)

    def to_representation(self, value: int) -> str:
        return micro_to_decimal_str(value)

    def to_internal_value(self, data) -> int:
        if isinstance(data, bool) or not isinstance(data, (str, int, float)):
            raise serializers.ValidationError('Dollars as a decimal string, like "1.45".')
        if isinstance(data, float):
            if not math.isfinite(data):
                raise serializers.ValidationError("Enter a finite amount in dollars.")
            data = repr(data)  # 1.45 → "1.45"; 1e-07 stays an exponent and is refused
        try:
            return parse_usd(
                str(data), field=self.field_name or "amount", max_decimals=self.max_decimals
            )
        except InvalidAmount as error:
            raise serializers.ValidationError(str(error)) from None


class UtcDateTimeField(IsoDateTimeField):
    """An ISO 8601 time, turned to UTC. Python takes UTC offsets up to ±23:59 and PostgreSQL
    only up to ±15:59, so a time sent with its own offset could fail in the database (a 500);
    in UTC it cannot. A time that leaves the calendar on the way is refused by name."""

    def clean(self, value):
        value = super().clean(value)
        if value is None:
            return None
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValidationError("Enter a time between the years 1 and 9999 in UTC.") from None


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField
