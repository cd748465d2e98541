"""The vast.ai API's own OpenAPI description, at /api/v0/schema/.

Its endpoints answer errors with vast's ``success`` and ``msg`` beside our ``error`` object,
so they stay out of /api/v1/schema/, whose description (and fuzz test) promise the ``error``
object alone; /api/v0/schema/ describes them with their paths relative to /api/v0.
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.views import SpectacularAPIView

API_PREFIX = "/api/"


class VastSchema(AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        # The whole site's schema (/api/v1/schema/) names them by full path: /api/v0/… and
        # the one v1 path the CLI calls (``update template``'s /api/v1/template/).
        if path.startswith(API_PREFIX):
            return None
        return super().get_operation(path, path_regex, path_prefix, method, registry)


schema_view = SpectacularAPIView.as_view(
    urlconf="marketplace.vast.urls",
    custom_settings={
        "TITLE": "GPU Marketplace: vast.ai-compatible API",
        "DESCRIPTION": (
            "The paths and shapes the official `vastai` CLI (1.9.1) uses, over the same "
            "services as /api/v1/. Authenticate with `Authorization: Bearer <team API key>` "
            '(the CLI\'s --api-key). Errors: `{"success": false, "msg": "…", "error": '
            '{"code", "message", "fields"}}`. Which CLI commands work: '
            "docs/vast-cli-compatibility.md."
        ),
        "VERSION": "0",
        "SERVERS": [{"url": "/api/v0"}],
    },
)
