"""Routes for operators and probes (health, readiness, metrics), mounted at the site root."""

from __future__ import annotations

from django.urls import path

from marketplace.observability import metrics, probes, views

urlpatterns = [
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("operator/", views.operator, name="operator"),
]
