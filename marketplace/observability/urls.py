"""Routes for operators and probes (health, readiness, metrics), mounted at the site root."""

from __future__ import annotations

urlpatterns: list = []
