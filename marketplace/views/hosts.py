"""Console pages for the hosts room (views live here so they go through the tenancy gateway)."""

from __future__ import annotations

urlpatterns: list = []
