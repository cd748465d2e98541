"""One error format for every API error::

    {"error": {"code": "validation_error", "message": "…", "fields": {"name": ["…"]}}}

Domain errors from any app are rendered when they carry ``http_status`` and ``error_code``
attributes (for example billing's insufficient-credit error → 402), so lower apps need not
import DRF or this module.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def _flatten(detail) -> list[str]:
    if isinstance(detail, dict):
        return [f"{key}: {msg}" for key, value in detail.items() for msg in _flatten(value)]
    if isinstance(detail, list):
        return [msg for item in detail for msg in _flatten(item)]
    return [str(detail)]


def _fields(detail) -> dict[str, list[str]]:
    if not isinstance(detail, dict):
        return {}
    return {str(key): _flatten(value) for key, value in detail.items()}


def api_exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        detail = (
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
        exc = exceptions.ValidationError(detail)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found.")
    elif hasattr(exc, "http_status") and hasattr(exc, "error_code"):
        fields = getattr(exc, "fields", None) or {}
        return Response(error_body(exc.error_code, str(exc), fields), status=exc.http_status)

    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _fields(exc.detail)
        if fields:
            message = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in fields.items())
        else:
            message = " ".join(_flatten(exc.detail))
            fields = {"non_field_errors": _flatten(exc.detail)}
        response.data = error_body("validation_error", message, fields)
    else:
        code = getattr(exc, "default_code", "error")
        detail = getattr(exc, "detail", str(exc))
        response.data = error_body(str(code), " ".join(_flatten(detail)))
    return response


def api_not_found(request, exception=None):
    return JsonResponse(
        error_body("not_found", f"No API endpoint at {request.path}."),
        status=status.HTTP_404_NOT_FOUND,
    )
