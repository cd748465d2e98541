"""What every console form shares: refusals by field, and the one rule for whole numbers."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

MAX_WHOLE_DIGITS = 9  # more than any count, size or port in a form; far from overflowing a column


def whole_number(text: str | None) -> int:
    """A whole, non-negative number of at most nine digits, or ``ValueError`` saying why not."""
    text = (text or "").strip()
    if not text.isdigit() or not text.isascii() or len(text) > MAX_WHOLE_DIGITS:
        raise ValueError("A whole number.")
    return int(text)


class ConsoleForm(forms.Form):
    def parsed(self) -> dict[str, Any]:
        """The cleaned fields, or a ``ValidationError`` by field that the page shows as
        "<field>: <reason>" like the services' own refusals."""
        if not self.is_valid():
            raise ValidationError(self.errors.as_data())
        return self.cleaned_data


class WholeNumberField(forms.Field):
    """A whole, non-negative number (the console's one rule for counts and ports); left empty,
    it is ``default``."""

    def __init__(self, *, default: int, **kwargs: Any) -> None:
        self.default = default
        super().__init__(required=False, **kwargs)

    def to_python(self, value: str | None) -> int:
        if not (value or "").strip():
            return self.default
        try:
            return whole_number(value)
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None
