"""``vastai create/search/update/delete template`` and ``create instance --template_hash``, over
the templates of /api/v1/templates/ (marketplace/services/templates.py).

vast.ai's template body names the image and its tag apart, keeps env and ports as one "Docker
options" string (``-e K=V -p 8080:8080``) and the launch as a runtype; a template here keeps
them as a rent request does. What vast.ai's templates have and ours do not (search filters,
registry logins, Jupyter Lab) is refused naming the CLI's flag, never dropped.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from marketplace.models import ApiKey, Template
from marketplace.services.templates import template_create, template_delete, template_update
from marketplace.tenancy import team_objects, team_or_public_objects
from marketplace.vast import shapes
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, RenterView, json_param
from scheduler.models import LaunchMode

# The search filters ``create template`` always sends (the CLI's defaults): every offer here
# is rentable and none external, so keeping them would filter nothing.
DEFAULT_FILTERS = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True}}
RUNTYPE_MODES = {
    "args": LaunchMode.ENTRYPOINT,
    "ssh": LaunchMode.SSH,
    "jupyter": LaunchMode.JUPYTER,
}
# Fields of vast.ai's template body we cannot keep, by the CLI's flag: set, they are refused.
UNSUPPORTED_TEMPLATE_FIELDS = {
    "docker_login_repo": ("--login", "private registry logins go through /api/v1/instances/"),
    "use_jupyter_lab": ("--jupyter-lab", "Jupyter mode starts the image's own Jupyter"),
    "jupyter_dir": ("--jupyter-dir", "Jupyter mode starts the image's own Jupyter"),
    "href": ("--href", "templates keep a readme; put the link in it"),
    "repo": ("--repo", "templates keep a readme; put the link in it"),
}
# vast.ai's searchable template fields that mean something here.
SEARCH_FIELDS = {"id": "pk", "hash_id": "hash_id", "name": "name", "image": "image"}


# --- translation -----------------------------------------------------------------------------


def docker_options(text: Any) -> tuple[dict[str, str], list[int]]:
    """The "Docker options" string (``-e K=V -p 8080:8080``) → env and container ports."""
    if text in (None, ""):
        return {}, []
    if not isinstance(text, str):
        raise Refused("--env is one string of Docker options, like '-e K=V -p 80:80'.", field="env")
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise Refused(f"--env: {error}.", field="env") from None
    options: dict[str, str] = {}
    while words:
        flag = words.pop(0)
        if flag not in ("-e", "-p") or not words:
            raise Refused(
                f"--env option '{flag}' is not supported: only -e NAME=value and -p PORT:PORT.",
                field="env",
            )
        value = words.pop(0)
        if flag == "-p":
            options[f"-p {value}"] = "1"
        elif "=" not in value:
            raise Refused(f"--env: '-e {value}' is not NAME=value.", field="env")
        else:
            name, _, setting = value.partition("=")
            options[name] = setting
    return shapes.split_env(options)


def template_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The CLI's template body → the fields of our template."""
    for key, (flag, why) in UNSUPPORTED_TEMPLATE_FIELDS.items():
        if body.get(key) not in (None, False, ""):
            raise Refused(f"{flag} is not supported: {why}.", field=flag.lstrip("-"))
    if body.get("extra_filters") not in (None, {}, DEFAULT_FILTERS):
        raise Refused(
            "--search_params is not supported: a template here keeps launch settings, not an "
            "offer search; search offers when you rent.",
            field="search_params",
        )
    if body.get("readme_visible") is False:
        raise Refused("--hide-readme is not supported: a readme is shown.", field="hide-readme")
    runtype = body.get("runtype") or "args"
    mode = RUNTYPE_MODES.get(runtype) if isinstance(runtype, str) else None
    if mode is None:
        raise Refused(f"Unknown launch type '{str(runtype)[:40]}'.", field="runtype")
    onstart = body.get("onstart") or ""
    if not isinstance(onstart, str):
        raise Refused("--onstart-cmd is text.", field="onstart-cmd")
    if onstart and mode != LaunchMode.ENTRYPOINT:
        raise Refused(
            "--onstart-cmd runs here only as the entrypoint of an args launch; SSH and Jupyter "
            "launches start the image's own sshd or Jupyter and run no onstart script.",
            field="onstart-cmd",
        )
    image, tag = body.get("image"), body.get("tag")
    if isinstance(image, str) and isinstance(tag, str) and tag:
        image = f"{image}:{tag}"
    env, ports = docker_options(body.get("env"))
    fields = {
        "name": body.get("name") or "",
        "description": body.get("desc") or "",
        "readme": body.get("readme") or "",
        "public": body.get("private") is False,
        "image": image or "",
        "launch_mode": mode,
        "entrypoint": onstart,
        "env": env,
        "ports": ports,
        "disk_gb": template_disk(body.get("recommended_disk_space")),
    }
    if not isinstance(fields["readme"], str) or not isinstance(fields["description"], str):
        raise Refused("--readme and --desc are text.", field="readme")
    return fields


def template_disk(value: Any) -> int:
    """``--disk_space`` (the CLI sends it as text) → whole GB, rounded up; 10 when not given."""
    if value in (None, ""):
        return 10
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Refused("--disk_space is a number of GB, like 40.", field="disk_space") from None
    if not math.isfinite(number) or not 0 < number <= 100_000:
        raise Refused("--disk_space is more than 0 and at most 100000 GB.", field="disk_space")
    return math.ceil(number)


def template_row(template: Template) -> dict[str, Any]:
    """A template as ``search templates`` prints it (vast.ai's field names)."""
    image, tag = split_tag(template.image)
    options = [f"-e {shlex.quote(f'{k}={v}')}" for k, v in template.env.items()]
    options += [f"-p {port}:{port}" for port in template.ports]
    return {
        "id": template.pk,
        "hash_id": template.hash_id,
        "name": template.name,
        "image": image,
        "tag": tag,
        "env": " ".join(options),
        "onstart": template.entrypoint or None,
        "args": list(template.args),
        "runtype": shapes.runtype_of(template.launch_mode),
        "use_ssh": template.launch_mode != LaunchMode.ENTRYPOINT,
        "ssh_direct": template.launch_mode != LaunchMode.ENTRYPOINT,
        "jup_direct": template.launch_mode == LaunchMode.JUPYTER,
        "recommended_disk_space": float(template.disk_gb),
        "readme": template.readme,
        "readme_visible": True,
        "desc": template.description,
        "private": not template.public,
        "creator_id": template.team_id,
        "created_at": template.created_at.timestamp(),
        "count_created": None,
    }


def split_tag(reference: str) -> tuple[str, str | None]:
    """``repo/name:tag`` → (``repo/name``, ``tag``); a registry's port is no tag."""
    name, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag:
        return reference, None
    return name, tag


# --- views -----------------------------------------------------------------------------------


def creator(request):
    return request.auth.created_by if isinstance(request.auth, ApiKey) else request.user


class Templates(RenterView):
    """``search templates`` (GET), ``create template`` (POST), ``delete template`` (DELETE)."""

    @extend_schema(summary="vast.ai: search templates", responses={200: ANY_JSON})
    def get(self, request):
        found = searched(
            team_or_public_objects(self.team, Template.objects.all()),
            json_param(request, "select_filters"),
            self.team,
        )
        return Response({"templates": [template_row(t) for t in found.order_by("pk")[:500]]})

    @extend_schema(
        summary="vast.ai: create template",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request):
        template = template_create(
            team=self.team, user=creator(request), fields=template_fields(self.body())
        )
        return Response({"success": True, "template": template_row(template)})

    @extend_schema(
        summary="vast.ai: delete template",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def delete(self, request):
        template = own_template(self.team, self.body())
        template_delete(template=template)
        return Response({"success": True, "msg": f"Template {template.hash_id} deleted."})


class TemplateV1(RenterView):
    """``update template HASH``: the CLI 1.9.1 saves the whole template at vast.ai's
    ``PUT /api/v1/template/``; every field is replaced by what it sends."""

    @extend_schema(
        summary="vast.ai: update template",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request):
        body = self.body()
        template = own_template(self.team, body)
        template = template_update(template=template, fields=template_fields(body))
        return Response({"success": True, "template": template_row(template)})


def own_template(team, body: dict[str, Any]) -> Template:
    """The team's template the body names (``hash_id``, or ``template_id``/``id``); another
    team's, public or not, answers 404: only its team changes it."""
    mine = team_objects(team, Template.objects.all())
    hash_id = body.get("hash_id")
    number = body.get("template_id") or body.get("id")
    if isinstance(hash_id, str) and hash_id:
        found = mine.filter(hash_id=hash_id).first()
        named = hash_id[:40]
    elif isinstance(number, int) and not isinstance(number, bool) and 0 < number < 2**63:
        found = mine.filter(pk=number).first()
        named = str(number)
    else:
        raise Refused("Name the template with --hash-id or --template-id.", field="hash_id")
    if found is None:
        raise NotFound(f"Template {named} is not one of your team's templates.")
    return found


def searched(templates: QuerySet, filters: Any, team) -> QuerySet:
    """``search templates '<query>'``: eq/neq/in on id, hash_id, name, image; ``private=true``
    (only the team's own) and ``creator_id``. Any other field is refused, naming it."""
    if filters in (None, {}):
        return templates
    if not isinstance(filters, dict):
        raise Refused("select_filters is an object.", field="select_filters")
    for name, condition in filters.items():
        if not isinstance(condition, dict) or len(condition) != 1:
            raise Refused(f"{name}: one condition, like {{'eq': value}}.", field=name)
        op, value = next(iter(condition.items()))
        if name == "private":
            if op != "eq" or not isinstance(value, bool):
                raise Refused("private is true or false.", field="private")
            mine = team_objects(team, templates)
            templates = mine if value else templates.exclude(pk__in=mine.values("pk"))
            continue
        if name == "creator_id":
            column = "team_id"
        elif name in SEARCH_FIELDS:
            column = SEARCH_FIELDS[name]
        else:
            raise Refused(
                f"search templates filters by {', '.join([*SEARCH_FIELDS, 'creator_id', 'private'])}"
                f" here, not by {name}.",
                field=name,
            )
        wanted = value if op == "in" and isinstance(value, list) else [value]
        kind = int if column in ("pk", "team_id") else str
        if not all(isinstance(v, kind) and not isinstance(v, bool) for v in wanted):
            raise Refused(f"{name} is {'a whole number' if kind is int else 'text'}.", field=name)
        if op == "eq":
            templates = templates.filter(**{column: value})
        elif op == "neq":
            templates = templates.exclude(**{column: value})
        elif op == "in" and isinstance(value, list):
            templates = templates.filter(**{f"{column}__in": value})
        else:
            raise Refused(f"{name}: use =, != or in.", field=name)
    return templates
