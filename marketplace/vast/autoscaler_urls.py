"""vast.ai's autoscaler paths, which the ``vastai`` CLI 1.9.1 calls at the root of ``--url``
(marketplace/vast/serverless_views.py); with or without the trailing slash."""

from __future__ import annotations

from django.urls import re_path

from marketplace.vast import serverless_views

urlpatterns = [
    re_path(
        r"^get_endpoint_workers/?$",
        serverless_views.EndpointWorkers.as_view(),
        name="vast-endpoint-workers",
    ),
    re_path(
        r"^get_endpoint_logs/?$", serverless_views.EndpointLogs.as_view(), name="vast-endpoint-logs"
    ),
    re_path(
        r"^get_autogroup_logs/?$",
        serverless_views.WorkergroupLogs.as_view(),
        name="vast-workergroup-logs",
    ),
    re_path(
        r"^update_workers/?$", serverless_views.UpdateWorkers.as_view(), name="vast-update-workers"
    ),
]
