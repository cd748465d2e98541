"""The console's templates page: the team's templates and the public ones, create, edit and
delete the team's own (marketplace/services/templates.py), and "Rent from template", which
opens the offers page with the rent dialog filled in from it (``/offers/?template=<hash>``)."""

from __future__ import annotations

import shlex
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Case, IntegerField, Value, When
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from marketplace.forms.rentals import (
    TextFormatField,
    WholeNumberText,
    args_from_shell_words,
    env_from_lines,
    ports_from_text,
)
from marketplace.models import Role, Template
from marketplace.services.templates import template_create, template_delete, template_update
from marketplace.tenancy import team_object_or_404, team_or_public_objects
from marketplace.views.console import error_text, require_role
from scheduler.models import LaunchMode


class TemplateForm(forms.Form):
    """The page's form: the rent dialog's text formats (env lines, shell-split arguments,
    ports by commas); what the values may be is the service's rule."""

    name = forms.CharField(required=False)
    description = forms.CharField(required=False)
    image = forms.CharField(required=False)
    launch_mode = forms.CharField(required=False)
    entrypoint = forms.CharField(required=False)
    args = TextFormatField(args_from_shell_words)
    env = TextFormatField(env_from_lines)
    ports = TextFormatField(ports_from_text)
    disk_gb = WholeNumberText(absent=10)
    readme = forms.CharField(required=False, strip=False)
    public = forms.BooleanField(required=False)

    def fields_or_error(self) -> dict[str, Any]:
        if not self.is_valid():
            raise ValidationError(
                {name: [str(m) for m in errors] for name, errors in self.errors.items()}
            )
        data = dict(self.cleaned_data)
        data["launch_mode"] = data["launch_mode"] or LaunchMode.ENTRYPOINT
        return data


def as_form_values(template: Template) -> dict[str, Any]:
    """A template's settings in the text formats of the page's and the rent dialog's inputs."""
    return {
        "args": shlex.join(template.args),
        "env": "\n".join(f"{k}={v}" for k, v in template.env.items()),
        "ports": ", ".join(str(p) for p in template.ports),
    }


def visible_templates(request: HttpRequest):
    """The team's own first, then the public ones of other teams."""
    return (
        team_or_public_objects(request.team, Template.objects.all())
        .annotate(
            own=Case(
                When(team=request.team, then=Value(1)),
                default=Value(0),
                output_field=IntegerField(),
            )
        )
        .order_by("-own", "name", "pk")
    )


@login_required
def templates(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        require_role(request, Role.MEMBER)
        form = TemplateForm(request.POST)
        try:
            made = template_create(
                team=request.team, user=request.user, fields=form.fields_or_error()
            )
        except ValidationError as error:
            messages.error(request, f"Could not save the template: {error_text(error)}")
            return _page(request, form_values=request.POST, status=400)
        messages.success(request, f"Template {made.name} saved.")
        return redirect("templates")
    return _page(request)


def _page(request: HttpRequest, *, form_values=None, status: int = 200) -> HttpResponse:
    rows = [{"template": t, **as_form_values(t)} for t in visible_templates(request)[:500]]
    return render(
        request,
        "marketplace/templates.html",
        {
            "rows": rows,
            "launch_modes": LaunchMode.choices,
            "can_edit": request.membership.allows(Role.MEMBER),
            "form_values": form_values or {},
        },
        status=status,
    )


@login_required
def template_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """The team's own template only: another team's, public or not, answers 404."""
    template = team_object_or_404(request.team, Template.objects.all(), pk=pk)
    if request.method == "POST":
        require_role(request, Role.MEMBER)
        form = TemplateForm(request.POST)
        try:
            template = template_update(template=template, fields=form.fields_or_error())
        except ValidationError as error:
            messages.error(request, f"Could not save the template: {error_text(error)}")
            return render(
                request,
                "marketplace/template_edit.html",
                {"template": template, "values": request.POST, "launch_modes": LaunchMode.choices},
                status=400,
            )
        messages.success(request, f"Template {template.name} saved.")
        return redirect("templates")
    values = {
        "name": template.name,
        "description": template.description,
        "image": template.image,
        "launch_mode": template.launch_mode,
        "entrypoint": template.entrypoint,
        "disk_gb": template.disk_gb,
        "readme": template.readme,
        "public": template.public,
        **as_form_values(template),
    }
    return render(
        request,
        "marketplace/template_edit.html",
        {"template": template, "values": values, "launch_modes": LaunchMode.choices},
    )


@login_required
@require_POST
def template_remove(request: HttpRequest, pk: int) -> HttpResponse:
    require_role(request, Role.MEMBER)
    template = team_object_or_404(request.team, Template.objects.all(), pk=pk)
    template_delete(template=template)
    messages.success(request, f"Template {template.name} deleted.")
    return redirect("templates")


def template_for_rent(request: HttpRequest) -> dict[str, Any] | None:
    """``?template=<hash>`` on the offers page: the template (the team's or public) whose
    settings fill the rent dialog, with its inputs' text; None when none is named or found."""
    hash_id = request.GET.get("template", "")
    if not hash_id:
        return None
    template = (
        team_or_public_objects(request.team, Template.objects.all())
        .filter(hash_id=hash_id[:64])
        .first()
    )
    if template is None:
        return None
    return {"template": template, **as_form_values(template)}


urlpatterns = [
    path("templates/", templates, name="templates"),
    path("templates/<id:pk>/", template_edit, name="template-edit"),
    path("templates/<id:pk>/delete/", template_remove, name="template-delete"),
]
