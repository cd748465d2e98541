"""One error format for every API error::

    {"error": {"code": "validation_error", "message": "…", "fields": {"name": ["…"]}}}

Domain errors from any app are rendered when they carry ``http_status`` and ``error_code``
attributes (for example billing's insufficient-credit error → 402), so lower apps need not
import DRF or this module.
"""

from __future__ import annotations

import logging
import sys

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.signals import got_request_exception
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import csrf, defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

from marketplace.observability.outages import outage_body, outage_response, service_down

API_PREFIX = "/api/"
logger = logging.getLogger("django.request")


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
    elif isinstance(exc, RequestDataTooBig):  # a form body past DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(error_body("request_too_large", str(exc)), status=413)
    elif isinstance(exc, SuspiciousOperation):  # too many form fields or files, and the like
        return Response(error_body("bad_request", str(exc)), status=400)
    elif hasattr(exc, "http_status") and hasattr(exc, "error_code"):
        fields = getattr(exc, "fields", None) or {}
        return Response(error_body(exc.error_code, str(exc), fields), status=exc.http_status)

    response = exception_handler(exc, context)
    if response is None:
        return _server_error(exc, context)
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


def _server_error(exc: Exception, context) -> Response:
    """An unexpected exception: logged with its traceback (as Django logs a 500), answered in
    the error shape with nothing of the exception in it."""
    request = context.get("request")
    django_request = getattr(request, "_request", request)
    set_rollback()
    if service := service_down(exc):
        outage = outage_response(django_request, service, exc)
        return Response(
            outage_body(service), status=503, headers={"Retry-After": outage["Retry-After"]}
        )
    logger.error(
        "Internal Server Error: %s",
        getattr(django_request, "path", "?"),
        exc_info=(type(exc), exc, exc.__traceback__),
        extra={"status_code": 500, "request": django_request},
    )
    # Django's own handler sends this signal for an uncaught exception; the test client uses it
    # to re-raise the exception in the test, so a bug shows its traceback there as before.
    if sys.exc_info()[1] is exc:
        got_request_exception.send(sender=None, request=django_request)
    return Response(server_error_body(), status=status.HTTP_500_INTERNAL_SERVER_ERROR)


def server_error_body() -> dict:
    return error_body(
        "server_error", "Something went wrong on our side; it was logged. Please try again."
    )


@csrf_exempt  # answers every method with the same 404 and changes nothing
def api_not_found(request, exception=None):
    message = f"No API endpoint at {request.path}."
    body = error_body("not_found", message)
    if request.path.startswith(VAST_PREFIX):  # the vast CLI prints ``msg`` (vast/errors.py)
        body = {"success": False, "msg": message, **body}
    return JsonResponse(body, status=status.HTTP_404_NOT_FOUND)


VAST_PREFIX = "/api/v0/"


# Project-wide handlers (``marketplace.urls``): under /api/ the error shape, elsewhere Django's
# pages. They catch what DRF never sees: errors in middleware, non-DRF views, unknown URLs.


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def bad_request(request: HttpRequest, exception=None) -> HttpResponse:
    if _is_api(request):
        return JsonResponse(error_body("bad_request", "The request is malformed."), status=400)
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception=None) -> HttpResponse:
    if _is_api(request):
        message = str(exception) if exception and str(exception) else "Permission denied."
        return JsonResponse(error_body("permission_denied", message), status=403)
    return defaults.permission_denied(request, exception)


def page_not_found(request: HttpRequest, exception=None) -> HttpResponse:
    if _is_api(request):
        return api_not_found(request)
    return defaults.page_not_found(request, exception)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A session's write without its CSRF token: under /api/ the error shape (DRF's own views
    answer this themselves; this covers any other view there), elsewhere Django's page."""
    if _is_api(request):
        message = "CSRF check failed: a signed-in session's write needs the X-CSRFToken header."
        return JsonResponse(error_body("permission_denied", message), status=403)
    return csrf.csrf_failure(request, reason)


def server_error(request: HttpRequest) -> HttpResponse:
    if service := service_down(sys.exc_info()[1]):
        return outage_response(request, service, sys.exc_info()[1])
    if _is_api(request):
        return JsonResponse(server_error_body(), status=500)
    return defaults.server_error(request)
