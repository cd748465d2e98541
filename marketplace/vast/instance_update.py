"""``vastai update instance ID [--template_hash_id H] [--image …] [--env '{…}'] [--args …]
[--onstart …]``: the instance is recreated with the new settings on its GPUs.

That is a new version of the rental (``rental_new_version``, what ``PATCH
/api/v1/instances/<id>/`` and the console's "Change" do): the current container stops and is
kept as the previous version, a new one starts on the same machine and GPUs.
"""

from __future__ import annotations

import shlex
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from marketplace.models import Template
from marketplace.rentals.versions import rental_new_version
from marketplace.tenancy import team_or_public_objects
from marketplace.vast import shapes
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, RenterView
from scheduler.models import Instance, LaunchMode
from scheduler.services.versions import version_spec


def template_of(team, body: dict[str, Any]) -> Template | None:
    """The template ``--template_hash_id`` or ``--template_id`` names (the team's own or a
    public one), or None when neither is given."""
    hash_id, number = body.get("template_hash_id"), body.get("template_id")
    if hash_id is None and number is None:
        return None
    found = team_or_public_objects(team, Template.objects.all())
    if isinstance(hash_id, str) and hash_id:
        template, named = found.filter(hash_id=hash_id).first(), hash_id[:40]
    elif isinstance(number, int) and not isinstance(number, bool) and 0 < number < 2**63:
        template, named = found.filter(pk=number).first(), str(number)
    else:
        raise Refused("--template_hash_id is a template's hash_id.", field="template_hash_id")
    if template is None:
        raise NotFound(f"There is no template {named} of yours or public.")
    return template


def template_changes(template: Template, current: dict[str, Any]) -> dict[str, Any]:
    """The template's settings as a new version's spec (its disk at least the current one:
    a version never shrinks the disk under the container's files)."""
    return {
        "image": template.image,
        "launch_mode": template.launch_mode,
        "env": {**current["env"], **template.env},
        "ports": list(template.ports),
        "entrypoint": template.entrypoint,
        "args": list(template.args),
        "disk_gb": max(template.disk_gb, current["disk_gb"]),
    }


def update_changes(team, instance: Instance, body: dict[str, Any]) -> dict[str, Any]:
    """The CLI's body → the new version's changes: the template's settings, then what the
    flags give. ``--env`` (a JSON object, ``-p P:P`` keys publishing ports) adds to or
    changes the instance's variables; ``--args`` is split as a shell would, and with
    ``--onstart`` (the entrypoint) is only for an ``--args`` launch, as at create."""
    current = version_spec(instance)
    template = template_of(team, body)
    changes = template_changes(template, current) if template else {}
    mode = changes.get("launch_mode", current["launch_mode"])
    image = body.get("image")
    if image is not None:
        if not isinstance(image, str) or not image:
            raise Refused("--image is an image name.", field="image")
        changes["image"] = image
    if body.get("env") is not None:
        env, ports = shapes.split_env(body["env"])
        changes["env"] = {**changes.get("env", current["env"]), **env}
        if ports:
            changes["ports"] = sorted({*changes.get("ports", current["ports"]), *ports})
    for flag, key in (("args", "args"), ("onstart", "entrypoint")):
        value = body.get(flag)
        if value is None:
            continue
        if mode != LaunchMode.ENTRYPOINT:
            raise Refused(
                f"--{flag} is for an --args launch; this instance runs the image's own "
                f"{'sshd' if mode == LaunchMode.SSH else 'Jupyter'}.",
                field=flag,
            )
        if not isinstance(value, str):
            raise Refused(f"--{flag} is text.", field=flag)
        try:
            changes[key] = shlex.split(value) if key == "args" else value
        except ValueError:
            raise Refused("--args has an unclosed quote.", field="args") from None
    if not changes:
        raise Refused(
            "Give --template_hash_id, --image, --env, --args or --onstart: what to change.",
            field="image",
        )
    return changes


class InstanceUpdate(RenterView):
    @extend_schema(
        summary="vast.ai: update instance",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, pk: int):
        instance = self.instance(pk)
        changes = update_changes(self.team, instance, self.body())
        moved = rental_new_version(
            instance=instance,
            changes=changes,
            by=str(getattr(request.user, "username", "") or ""),
            reason="vastai update instance",
        )
        return Response(
            {
                "success": True,
                "msg": f"Instance {moved.pk} is starting as version {moved.version}.",
                "version": moved.version,
            }
        )
