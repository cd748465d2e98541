"""Structured logs: every line carries the context of the work it belongs to.

structlog renders every log record, ours and every library's (Django, Celery, paramiko), so
one format covers them all. Context lives in structlog's context variables:

- a web request gets ``request_id`` (and ``user_id``) from django-structlog's
  ``RequestMiddleware``; ``LogContextMiddleware`` below adds ``ip`` and ``team_id``;
- a task queued during the request carries that context in its message headers
  (django-structlog's Celery integration: ``DJANGO_STRUCTLOG_CELERY_ENABLED`` for publishing,
  the worker boot step in marketplace/celery.py for receiving), and the worker binds
  ``task_id`` beside it;
- the rental tasks bind ``instance_id`` and ``team_id`` (marketplace/tasks.py), so the SSH
  command lines logged by hosts/ssh.py under them carry the whole chain: one rental can be
  followed from the API call to the ``docker run`` on its host, across processes.

Format (``LOG_FORMAT``): ``json``, one object a line, for production and log collectors;
``console``, aligned ``key=value`` text, for ``make run`` where a person reads the log files.
It defaults to ``console`` with DEBUG on and ``json`` otherwise, so a production process that
forgets to set it still writes lines a collector can parse.

Django calls ``configure_logging`` (``LOGGING_CONFIG`` in settings) in every process that
sets Django up; the Celery worker and beat call it too instead of installing their own
handlers (marketplace/celery.py).
"""

from __future__ import annotations

import logging.config
from typing import Any

import structlog
from django.http import HttpRequest, HttpResponse

# Added to every line, structlog's and the standard library's alike.
SHARED_PROCESSORS: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    # Standard-library calls pass fields with ``extra={…}`` (hosts/ssh.py does).
    structlog.stdlib.ExtraAdder(),
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def json_formatter() -> structlog.stdlib.ProcessorFormatter:
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=SHARED_PROCESSORS,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )


def console_formatter() -> structlog.stdlib.ProcessorFormatter:
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=SHARED_PROCESSORS,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # No colours: `make run` writes to files under var/log/.
            structlog.dev.ConsoleRenderer(colors=False),
        ],
    )


def configure_logging(logging_settings: dict) -> None:
    """Set up structlog, then the standard library from ``settings.LOGGING``."""
    structlog.configure(
        processors=[
            # A line below the logger's level is dropped before any work on it: django-
            # structlog's DEBUG "request_started" went through every processor below on
            # every request, to be discarded by the standard library at the end.
            structlog.stdlib.filter_by_level,
            *SHARED_PROCESSORS,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    logging.config.dictConfig(logging_settings)


class LogContextMiddleware:
    """Binds the address a request came from and the team it acts for to its log lines.

    The address is the peer's as uvicorn gives it (``REMOTE_ADDR``): uvicorn already takes
    the client's from X-Forwarded-For where the peer is a trusted proxy (``--proxy-headers``,
    ``--forwarded-allow-ips`` in deploy/systemd/gpumkt-web@.service). django-structlog's own
    lookup (python-ipware) believed the header from anyone, so a client could write the
    address of its lines, and it cost a twentieth of an offer search's time.

    A console request's team is known before the view (``ActiveTeamMiddleware``); an API
    key's only once DRF has authenticated it inside the view, so that one is bound afterwards,
    in time for django-structlog's ``request_finished`` line (this middleware sits inside it).
    The launch task binds the rental's team itself, whichever way the request came.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        context = {"ip": request.META.get("REMOTE_ADDR")}
        team = getattr(request, "team", None)
        if team is not None:
            context["team_id"] = team.pk
        structlog.contextvars.bind_contextvars(**context)
        response = self.get_response(request)
        api_key = getattr(request, "auth", None)
        team_id = getattr(api_key, "team_id", None)
        if team is None and team_id is not None:
            structlog.contextvars.bind_contextvars(team_id=team_id)
        return response
