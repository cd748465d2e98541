"""The API's JSON parser: bounded in size and nesting before anything reads the body.

A body nested thousands deep made Python's decoder raise RecursionError (a 500), and a body of
any size was read whole. Here a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (Django's one limit
on what a request may hold in memory, also applied to forms) answers 413, and one nested deeper
than ``MAX_JSON_DEPTH`` answers 400, both in the API's error shape. No request the API takes
nests deeper than a few levels.
"""

from __future__ import annotations

import json

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 32


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"
    default_detail = "The request body is too large."


def _too_deep(value, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` deep (iterative: a deep
    value must not be walked by recursion either)."""
    level = [value]
    for _ in range(limit):
        level = [
            child
            for node in level
            if isinstance(node, (list, dict))
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, (list, dict))
        ]
        if not level:
            return False
    return True


def json_body(raw: bytes | str, *, max_depth: int = MAX_JSON_DEPTH):
    """``raw`` parsed as strict JSON (no NaN or Infinity literals), or ``ValueError`` saying
    why not: malformed, or nested past ``max_depth``."""
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"JSON nested more than {max_depth} levels deep.") from None
    if _too_deep(value, max_depth):
        raise ValueError(f"JSON nested more than {max_depth} levels deep.")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number.")


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise RequestTooLarge(f"The request body is over {limit:,} bytes.")
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return json_body(raw.decode(encoding))
        except (UnicodeDecodeError, ValueError) as error:
            raise exceptions.ParseError(f"JSON parse error - {error}") from None
