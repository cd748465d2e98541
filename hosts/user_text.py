"""The one check for a name or label a user types (a machine, deployment, cluster, volume,
SSH key, API key, team, instance label): text shown back in lists and pages, so printable
characters only. ``str.isprintable`` refuses line breaks, tabs, escape and other control
characters, and format characters: right-to-left overrides (U+202E) and zero-width ones, which
would make a name read as something else.

It lives here, at the bottom of the imports (hosts imports no other app), so every app uses the
same rule.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError


def name_problem(value: object, *, max_length: int, required: bool = True) -> str | None:
    """Why ``value`` is not a name (None: it is one). Surrounding spaces count: strip first
    where they should not."""
    if not isinstance(value, str):
        return "Text, please."
    if required and not value.strip():
        return f"Give a name of 1 to {max_length} characters."
    if len(value) > max_length:
        return f"At most {max_length} characters."
    if not value.isprintable():
        return "Printable characters only (no line breaks, tabs, control or direction characters)."
    return None


def name_check(value: object, field: str, *, max_length: int, required: bool = True) -> None:
    """``ValidationError`` naming ``field`` unless ``value`` is a name (see ``name_problem``)."""
    problem = name_problem(value, max_length=max_length, required=required)
    if problem is not None:
        raise ValidationError({field: problem})
