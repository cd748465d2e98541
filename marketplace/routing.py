from __future__ import annotations

from django.urls import path

from marketplace.consumers import TeamEventsConsumer

websocket_urlpatterns = [
    path("ws/events/", TeamEventsConsumer.as_asgi()),
]
