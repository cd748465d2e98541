from __future__ import annotations

from django.urls import path

from marketplace.consumers import InstanceConsumer, TeamEventsConsumer

websocket_urlpatterns = [
    path("ws/events/", TeamEventsConsumer.as_asgi()),
    path("ws/instances/<int:instance_id>/", InstanceConsumer.as_asgi()),
]
