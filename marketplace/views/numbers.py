"""Numbers typed into console forms, read with the API's rules: a bad one is a
``ValidationError`` naming the field, before any service runs."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from marketplace.api.fields import finite_number

MAX_WHOLE_DIGITS = 9  # more than any count, size or port in a form; far from overflowing a column


def form_decimal(text: str | None, *, field: str, range_checked: bool = False) -> float:
    """A finite number (hours, say): "NaN", "inf" and "1e309" are refused naming the field.

    ``range_checked``: the service this number goes to refuses values outside its range,
    NaN and infinities included, with a message that names the range; let those through."""
    try:
        return finite_number(text)
    except ValueError as error:
        if range_checked:
            try:
                number = float((text or "").strip())
            except ValueError:
                pass
            else:
                return number
        raise ValidationError({field: str(error)}) from None


def whole_number(text: str | None) -> int:
    """A whole, non-negative number of at most nine digits, or ``ValueError`` saying why not
    (the caller names the field: ``form_whole`` here, the host console's form fields)."""
    text = (text or "").strip()
    if not text.isdigit() or not text.isascii() or len(text) > MAX_WHOLE_DIGITS:
        raise ValueError("A whole number.")
    return int(text)


def form_whole(text: str | None, *, field: str) -> int:
    """A whole, non-negative number of at most nine digits."""
    try:
        return whole_number(text)
    except ValueError as error:
        raise ValidationError({field: str(error)}) from None
