from __future__ import annotations

from django.urls import path, re_path

from marketplace.consumers import InstanceConsumer, NoSuchSocket, TeamEventsConsumer

websocket_urlpatterns = [
    path("ws/events/", TeamEventsConsumer.as_asgi()),
    path("ws/instances/<id:instance_id>/", InstanceConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),  # any other path: closed with 4404, not an error
]
