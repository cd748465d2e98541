"""Routes of the vast.ai-compatible API, mounted at /api/v0/."""

from __future__ import annotations

urlpatterns: list = []
