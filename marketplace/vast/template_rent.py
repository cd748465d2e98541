"""``create instance --template_hash``: the CLI's create body completed from a template.

Apart from ``templates.py`` (the template views) because renting (``views.rent_order``) needs
it, and the template views import ``views``: here it sits below both, with no import cycle.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotFound

from marketplace.models import Template
from marketplace.tenancy import team_or_public_objects
from marketplace.vast import shapes
from marketplace.vast.errors import Refused
from scheduler.models import LaunchMode


def rent_body_from_template(team, body: dict[str, Any]) -> dict[str, Any]:
    """``create instance --template_hash H``: the CLI's create body with what it leaves out
    taken from the template (the team's own, or a public one). Its disk is the least the
    template asks for, as vast.ai's recommended_disk_space is."""
    hash_id = body.get("template_hash_id")
    if not isinstance(hash_id, str):
        raise Refused("--template_hash is a template's hash_id.", field="template_hash")
    template = (
        team_or_public_objects(team, Template.objects.all())
        .filter(hash_id=hash_id)
        .order_by("-public")  # the team's own first: hash ids are unique anyway
        .first()
    )
    if template is None:
        raise NotFound(f"There is no template {hash_id[:40]} of yours or public.")
    given = body.get("env") or {}
    if not isinstance(given, dict):
        raise Refused("env is an object of NAME: value.", field="env")
    env = {**template.env, **{f"-p {port}:{port}": "1" for port in template.ports}, **given}
    merged = {**body, "template_hash_id": None, "env": env}
    merged["image"] = body.get("image") or template.image
    merged["runtype"] = body.get("runtype") or shapes.runtype_of(template.launch_mode)
    if merged["runtype"] == "jupyter":
        merged["runtype"] = "jupyter_proxy ssh_proxy"
    merged["onstart"] = body.get("onstart") or template.entrypoint or None
    if body.get("args") is None and template.launch_mode == LaunchMode.ENTRYPOINT:
        merged["args"] = list(template.args)
    disk = shapes.disk_gb(body.get("disk", 10))
    merged["disk"] = max(disk, template.disk_gb) if isinstance(disk, int) else disk
    return merged
