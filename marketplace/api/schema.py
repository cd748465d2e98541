"""Tells drf-spectacular how API keys authenticate, so the schema documents it."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "marketplace.api.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "gpk_<prefix>_<secret>",
            "description": "A team API key, created in the console under API keys.",
        }
