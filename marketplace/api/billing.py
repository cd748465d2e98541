"""REST API for the billing room."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

router = SimpleRouter()
urlpatterns: list = [*router.urls]
