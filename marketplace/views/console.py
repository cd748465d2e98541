"""What every console view shares: the role a page action needs, and how an error reads in
the message shown above the page (field by field, as the API names them)."""

from __future__ import annotations

from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.http import HttpRequest

from marketplace.models import Role


def require_role(request: HttpRequest, role: Role) -> None:
    if not request.membership.allows(role):
        raise PermissionDenied(f"This needs the {role.label.lower()} role in the team.")


def error_text(error: Exception) -> str:
    if isinstance(error, ValidationError):
        if hasattr(error, "error_dict"):
            return " ".join(
                " ".join(messages) if field == NON_FIELD_ERRORS
                else f"{field.replace('_', ' ')}: {' '.join(messages)}"
                for field, messages in error.message_dict.items()
            )  # fmt: skip
        return " ".join(error.messages)
    return str(error)
