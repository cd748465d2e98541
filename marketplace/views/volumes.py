"""The console's Volumes page: the team's volumes, their sizes and versions, what mounts
them; create, resize and delete (the same services as the API)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone

from hosts.runtime import CommandFailed, HostUnreachable
from marketplace.models import Offer, Role, Volume, VolumeState
from marketplace.rentals.volumes import (
    DEFAULT_VOLUME_HOURS,
    VolumeInUse,
    volume_create,
    volume_delete,
    volume_extend,
    volume_resize,
)
from marketplace.tenancy import team_object_or_404, team_objects
from marketplace.views.console import error_text, require_role


def _whole(value: str | None, field: str) -> int:
    try:
        return int((value or "").strip())
    except ValueError:
        raise ValidationError({field: "A whole number."}) from None


def _act(request: HttpRequest) -> None:
    action = request.POST.get("action")
    if action == "create":
        volume = volume_create(
            team=request.team,
            user=request.user,
            machine_id=_whole(request.POST.get("machine_id"), "machine_id"),
            name=request.POST.get("name", ""),
            size_gb=_whole(request.POST.get("size_gb"), "size_gb"),
            hours=float(_whole(request.POST.get("days"), "days") * 24),
        )
        volume.refresh_from_db()
        if volume.state == VolumeState.READY:
            messages.success(request, f"Volume {volume.name} ({volume.size_gb} GB) is ready.")
        elif volume.state == VolumeState.FAILED:
            messages.error(request, f"Volume {volume.name} could not be made: {volume.failure}")
        else:
            messages.success(
                request, f"Volume {volume.name} ({volume.size_gb} GB) is being made on its host."
            )
        return
    volume = team_object_or_404(
        request.team,
        Volume.objects.filter(state=VolumeState.READY),
        pk=request.POST.get("volume"),
    )
    if action == "resize":
        volume = volume_resize(
            volume=volume,
            size_gb=_whole(request.POST.get("size_gb"), "size_gb"),
            user=request.user,
        )
        messages.success(request, f"Volume {volume.name} is now {volume.size_gb} GB.")
    elif action == "extend":
        volume = volume_extend(
            volume=volume, hours=float(_whole(request.POST.get("days"), "days") * 24)
        )
        messages.success(
            request, f"Volume {volume.name} is held until {volume.ends_at:%Y-%m-%d %H:%M} UTC."
        )
    elif action == "delete":
        volume = volume_delete(volume=volume)
        volume.refresh_from_db()
        if volume.state == VolumeState.DELETED:
            messages.success(request, f"Volume {volume.name} deleted; its data is gone.")
        else:
            messages.success(
                request,
                f"Volume {volume.name} deleted and no longer charged; machine "
                f"{volume.machine_id} removes its data when it is back online.",
            )


@login_required
def volumes(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        require_role(request, Role.MEMBER)
        try:
            _act(request)
        except (ValidationError, VolumeInUse, HostUnreachable, CommandFailed) as error:
            messages.error(
                request, error_text(error) if isinstance(error, ValidationError) else str(error)
            )
        return redirect("volumes")
    rows = (
        team_objects(
            request.team,
            Volume.objects.filter(state__in=(VolumeState.CREATING, VolumeState.READY)),
        )
        .select_related("machine")
        .prefetch_related("versions", "mounts__instance")
    )
    listed = [
        {
            "volume": volume,
            "versions": list(volume.versions.all()),
            "mounted_by": [
                m.instance_id for m in volume.mounts.all() if m.instance.state != "destroyed"
            ],
        }
        for volume in rows
    ]
    machines = Offer.objects.filter(rentable=True, all_free=True).order_by("machine_id")[:200]
    return render(
        request,
        "marketplace/volumes.html",
        {
            "volumes": listed,
            "machines": machines,
            "default_days": DEFAULT_VOLUME_HOURS // 24,
            "now": timezone.now(),
        },
    )


urlpatterns = [path("volumes/", volumes, name="volumes")]
