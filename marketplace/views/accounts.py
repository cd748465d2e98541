"""Console pages for accounts and teams. Thin: forms in, services do the writes."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from marketplace.forms.accounts import ApiKeyForm, InvitationForm, RoleForm, SignUpForm, TeamForm
from marketplace.models import ApiKey, Invitation, Membership, Role
from marketplace.services import accounts as services
from marketplace.services.accounts import api_keys_with_creator_role
from marketplace.tenancy import ACTIVE_TEAM_SESSION_KEY, team_object_or_404, team_objects
from marketplace.views.console import error_text


def signup(request: HttpRequest) -> HttpResponse:
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = services.user_sign_up(
            username=form.cleaned_data["username"],
            email=form.cleaned_data["email"],
            password=form.cleaned_data["password1"],
        )
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, "Welcome! Your personal team is ready.")
        return redirect("console-home")
    return render(request, "registration/signup.html", {"form": form})


def login_locked_out(request: HttpRequest, original_response=None, credentials=None):
    """What django-axes answers once a user name is locked for this address: the log-in page
    again (429), saying why and for how long, with nothing about whether the password was
    right."""
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    message = (
        f"Too many failed log-ins for this user name from your address. Log-in is locked for "
        f"{minutes} minutes; try again later."
    )
    form = AuthenticationForm(request)
    return render(
        request, "registration/login.html", {"form": form, "locked_out": message}, status=429
    )


@login_required
def team_settings(request: HttpRequest) -> HttpResponse:
    team = request.team
    context = {
        "members": team_objects(team, Membership.objects.select_related("user")).order_by(
            "created_at"
        ),
        # Open and expired ones (each marked); accepted and revoked ones are history.
        "invitations": team_objects(
            team, Invitation.objects.filter(accepted_at=None, revoked_at=None)
        ).order_by("-created_at"),
        "invitation_form": InvitationForm(),
        "team_form": TeamForm(),
        "roles": Role.choices,
        "can_admin": request.membership.allows(Role.ADMIN),
    }
    return render(request, "marketplace/team.html", context)


@login_required
@require_POST
def team_switch(request: HttpRequest) -> HttpResponse:
    team_id = request.POST.get("team", "")
    membership = (
        Membership.objects.filter(user=request.user, team_id=int(team_id)).first()
        if team_id.isdigit() and len(team_id) < 19  # a number the database can hold
        else None
    )
    if membership is None:
        messages.error(request, "You are not a member of that team.")
    else:
        request.session[ACTIVE_TEAM_SESSION_KEY] = membership.team_id
        messages.success(request, f"Now acting for {membership.team.name}.")
    return redirect(_safe_next(request) or "console-home")


def _safe_next(request: HttpRequest) -> str | None:
    """The ``next`` page if it is on this site (never an open redirect to another host)."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return None


@login_required
@require_POST
def team_create(request: HttpRequest) -> HttpResponse:
    form = TeamForm(request.POST)
    if not form.is_valid():
        messages.error(request, "A team needs a name of at most 80 characters.")
        return redirect("team-settings")
    try:
        team = services.team_create(name=form.cleaned_data["name"], owner=request.user)
    except ValidationError as error:
        messages.error(request, f"Could not create the team: {error_text(error)}")
        return redirect("team-settings")
    request.session[ACTIVE_TEAM_SESSION_KEY] = team.id
    messages.success(request, f"Team {team.name} created; you are its owner.")
    return redirect("team-settings")


@login_required
@require_POST
def invitation_create(request: HttpRequest) -> HttpResponse:
    form = InvitationForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give a valid email address and role.")
        return redirect("team-settings")
    try:
        issued = services.invitation_create(
            membership=request.membership,
            email=form.cleaned_data["email"],
            role=Role(form.cleaned_data["role"]),
        )
    except (ValidationError, PermissionDenied) as error:
        messages.error(request, error_text(error))
        return redirect("team-settings")
    link = request.build_absolute_uri(f"/invitations/{issued.token}/")
    messages.success(
        request, f"Invitation created. Send this link to {issued.invitation.email}: {link}"
    )
    return redirect("team-settings")


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    invitation = team_object_or_404(request.team, Invitation.objects.all(), pk=pk)
    try:
        services.invitation_revoke(membership=request.membership, invitation=invitation)
    except PermissionDenied as error:
        messages.error(request, error_text(error))
    else:
        messages.success(request, f"Invitation for {invitation.email} revoked; its link is dead.")
    return redirect("team-settings")


@login_required
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    if request.method == "POST":
        try:
            membership = services.invitation_accept(token=token, user=request.user)
        except ValidationError as error:
            messages.error(request, error_text(error))
            return redirect("console-home")
        request.session[ACTIVE_TEAM_SESSION_KEY] = membership.team_id
        messages.success(request, f"You joined {membership.team.name}.")
        return redirect("team-settings")
    invitation = (
        Invitation.objects.select_related("team")
        .filter(token_hash=ApiKey.hash_secret(token))
        .first()
    )
    return render(request, "marketplace/invitation.html", {"invitation": invitation})


@login_required
@require_POST
def member_update(request: HttpRequest, pk: int) -> HttpResponse:
    target = team_object_or_404(request.team, Membership.objects.all(), pk=pk)
    try:
        if request.POST.get("action") == "remove":
            services.membership_remove(actor=request.membership, target=target)
            messages.success(request, f"{target.user.username} left the team.")
        else:
            form = RoleForm(request.POST)
            if not form.is_valid():
                raise ValidationError({"role": "Choose one of the listed roles."})
            services.membership_set_role(
                actor=request.membership, target=target, role=Role(form.cleaned_data["role"])
            )
            messages.success(request, f"{target.user.username} is now {target.get_role_display()}.")
    except (ValidationError, PermissionDenied) as error:
        messages.error(request, error_text(error))
    return redirect("team-settings")


@login_required
def api_keys(request: HttpRequest) -> HttpResponse:
    form = ApiKeyForm(request.POST or None)
    new_key = None
    if request.method == "POST" and form.is_valid():
        try:
            issued = services.api_key_create(membership=request.membership, **form.cleaned_data)
        except (ValidationError, PermissionDenied) as error:
            messages.error(request, error_text(error))
        else:
            new_key = issued.secret
            form = ApiKeyForm()
    context = {
        "form": form,
        "new_key": new_key,
        "keys": api_keys_with_creator_role(team_objects(request.team, ApiKey.objects.all())),
        "can_admin": request.membership.allows(Role.ADMIN),
    }
    return render(request, "marketplace/api_keys.html", context)


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    api_key = team_object_or_404(request.team, ApiKey.objects.all(), pk=pk)
    try:
        services.api_key_revoke(membership=request.membership, api_key=api_key)
        messages.success(request, f"Key {api_key.name} revoked.")
    except PermissionDenied as error:
        messages.error(request, error_text(error))
    return redirect("api-keys")
