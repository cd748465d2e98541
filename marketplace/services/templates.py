"""Templates: a team's saved launch settings, rented from again (``template_settings``) by the
team, or by anyone when public. Only the owning team changes or deletes one; rentals made from
it keep what they were launched with."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from hosts.user_text import name_check
from marketplace.models import Team, Template, User
from marketplace.validation import validate_launch
from scheduler.models import LaunchMode

MAX_README = 20_000
# What a template keeps and a rent request takes as it is.
LAUNCH_FIELDS = ("image", "launch_mode", "entrypoint", "args", "env", "ports", "disk_gb")
TEMPLATE_FIELDS = ("name", "description", "readme", "public", *LAUNCH_FIELDS)


def _check(fields: dict[str, Any]) -> None:
    name_check(fields.get("name"), "name", max_length=80)
    name_check(fields.get("description", ""), "description", max_length=300, required=False)
    image = fields.get("image")
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise ValidationError({"image": "Give the image to run, like 'pytorch/pytorch:latest'."})
    readme = fields.get("readme", "")
    if not isinstance(readme, str) or len(readme) > MAX_README:
        raise ValidationError({"readme": f"Text of at most {MAX_README} characters."})
    # What a rent checks of the settings, so a template is refused as a rent from it would be.
    validate_launch(
        image=image,
        env=fields.get("env", {}),
        ports=fields.get("ports", []),
        entrypoint=fields.get("entrypoint", ""),
        args=fields.get("args", []),
    )
    if fields.get("launch_mode", LaunchMode.ENTRYPOINT) not in LaunchMode.values:
        raise ValidationError({"launch_mode": f"Choose one of {', '.join(LaunchMode.values)}."})
    unknown = set(fields) - set(TEMPLATE_FIELDS)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: "Not a template setting."})


@transaction.atomic
def template_create(*, team: Team, user: User | None, fields: dict[str, Any]) -> Template:
    fields = {**fields, "name": (fields.get("name") or "").strip()}
    _check(fields)
    return Template.objects.create(team=team, created_by=user, **fields)


@transaction.atomic
def template_update(*, template: Template, fields: dict[str, Any]) -> Template:
    """Changes what is given; the rest stays. Instances rented from it are not touched."""
    template = Template.objects.select_for_update().get(pk=template.pk)
    if "name" in fields:
        fields = {**fields, "name": (fields["name"] or "").strip()}
    merged = {name: getattr(template, name) for name in TEMPLATE_FIELDS}
    merged.update(fields)
    _check(merged)
    for name, value in fields.items():
        setattr(template, name, value)
    template.save()
    return template


def template_delete(*, template: Template) -> None:
    template.delete()  # instances keep their own copy of every setting


def template_settings(template: Template) -> dict[str, Any]:
    """What a rent request from the template starts from (its own fields override these)."""
    return {name: getattr(template, name) for name in LAUNCH_FIELDS}
