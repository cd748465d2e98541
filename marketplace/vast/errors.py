"""Errors in the shape the ``vastai`` CLI prints.

The CLI shows ``Failed with error <status>: <msg>`` from a failed response's ``msg`` field and
reads ``error`` only to spot a search quota. So a v0 error is our one error shape
(``{"error": {"code", "message", "fields"}}``) with vast's ``success`` and ``msg`` beside it:
scripts written for either API read what they expect, and the message is ours.
"""

from __future__ import annotations

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from marketplace.api.errors import api_exception_handler, error_body


class Refused(Exception):
    """A vast.ai option or command this marketplace cannot honour: 400 saying so, never
    silently ignored. ``field`` names the CLI option (or request field) refused."""

    http_status = 400
    error_code = "not_supported"

    def __init__(self, message: str, *, field: str = ""):
        super().__init__(message)
        self.fields = {field: [message]} if field else {}


def with_msg(body: dict) -> dict:
    """Our error body, readable by the CLI too."""
    error = body.get("error")
    message = error.get("message", "") if isinstance(error, dict) else str(error or "")
    return {"success": False, "msg": message, **body}


def vast_exception_handler(exc, context):
    response = api_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict):
        response.data = with_msg(response.data)
    return response


def not_offered_body(request) -> dict:
    return with_msg(
        error_body(
            "not_found",
            f"This marketplace does not offer {request.method} {request.path} of the "
            "vast.ai API; see docs/vast-cli-compatibility.md for the commands that work.",
        )
    )


@csrf_exempt  # answers every method with the same 404 and changes nothing
def vast_not_found(request, exception=None):
    """Any other path under /api/v0/: the CLI's command is one we do not offer."""
    return JsonResponse(not_offered_body(request), status=404)


@csrf_exempt  # answers every method with the same 404 and changes nothing
def tfa_not_found(request):
    """The ``tfa`` (2FA) commands, which we do not offer either. The CLI's ``tfa login`` and
    ``tfa auth-new`` read ``error`` as vast's error code, a string (and crash on our error
    object), so here it is the code alone; ``msg`` says what is not offered."""
    body = not_offered_body(request)
    body["error"] = body["error"]["code"]
    return JsonResponse(body, status=404)
