"""``vastai update ssh-key <id> <public key>``: a team key's new public key (views.py has the
key's other commands; this module keeps that one near its size)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from marketplace.models import SshKey
from marketplace.services.ssh_keys import ssh_key_replace
from marketplace.tenancy import team_objects
from marketplace.vast import views
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON


class SshKeyDetail(views.SshKeyDetail):
    """``delete ssh-key`` (views.SshKeyDetail) and ``update ssh-key`` (PUT)."""

    @extend_schema(
        summary="vast.ai: update ssh-key",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, pk: int):
        public_key = self.body().get("ssh_key")
        if not isinstance(public_key, str):
            raise Refused("ssh_key is the new public key's text.", field="ssh_key")
        key = team_objects(self.team, SshKey.objects.all()).filter(pk=pk).first()
        if key is None:
            raise NotFound(f"SSH key {pk} is not one of your team's keys.")
        key = ssh_key_replace(key=key, public_key=public_key)
        return Response({"success": True, "key": views.ssh_key_row(key)})
