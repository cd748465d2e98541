"""A vast create body's volume: ``--link-volume`` mounts one of the team's volumes, and
``--create-volume`` makes one on the instance's machine before the rent (deleted again if the
rent fails). Below the vast views, which call it (``view`` is the calling view: its team,
request and body)."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

from django.utils import timezone
from rest_framework.exceptions import APIException, NotFound

from hosts.models import Machine
from hosts.runtime.volumes import MAX_VOLUME_GB
from marketplace.models import Offer, Volume, VolumeState
from marketplace.rentals.volumes import DEFAULT_VOLUME_HOURS, volume_create, volume_delete
from marketplace.url_ids import MAX_ID
from marketplace.vast.errors import Refused

# How long a volume made through the CLI is held for (see vast/volumes.py's note).
CLI_VOLUME_HOURS = DEFAULT_VOLUME_HOURS
# A rental with --create-volume waits this long for its host to make the volume.
NEW_VOLUME_PATIENCE_S = 90


def whole(value: Any, flag: str, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise Refused(f"{flag} is a whole number from {low} to {high}.", field=flag.lstrip("-"))
    return value


def volume_hours(machine_id: int) -> float:
    """30 days, or until the machine's end date when that comes sooner (at least an hour;
    the service refuses a machine whose end is nearer)."""
    end = Machine.objects.filter(pk=machine_id).values_list("end_date", flat=True).first()
    hours = float(CLI_VOLUME_HOURS)
    if end is not None:
        left = (end - timezone.now()).total_seconds() / 3600
        hours = min(hours, max(math.floor(left * 100) / 100 - 0.01, 1.0))
    return hours


def new_volume(view: Any, offer_id: Any, size: Any, name: Any) -> Volume:
    """A volume on the volume offer's machine (the team's role and key are checked as for any
    write of this view)."""
    machine_id = whole(offer_id, "id", 1, MAX_ID)
    size_gb = whole(size, "--size", 1, MAX_VOLUME_GB)
    if name in (None, ""):
        name = f"volume-{uuid.uuid4().hex[:8]}"
    if not isinstance(name, str):
        raise Refused("--name is text.", field="name")
    membership = getattr(view.request, "membership", None)
    return volume_create(
        team=view.team,
        user=membership.user if membership is not None else None,
        machine_id=machine_id,
        name=name,
        size_gb=size_gb,
        hours=volume_hours(machine_id),
    )


class VolumeNotReady(APIException):
    status_code = 503
    default_code = "volume_not_ready"


def mount_of(body: dict[str, Any]) -> tuple[dict[str, Any], Any] | None:
    """The CLI's ``volume_info`` → (the mount's fields, whether a new volume is asked for)."""
    info = body.get("volume_info")
    if info in (None, {}):
        return None
    if not isinstance(info, dict):
        raise Refused("volume_info is an object.", field="volume_info")
    path = info.get("mount_path")
    if not isinstance(path, str) or not path:
        raise Refused("--mount-path is the path to mount the volume at.", field="mount-path")
    return info, path


def with_linked_volume(body: dict[str, Any]) -> dict[str, Any]:
    """``--link-volume <id> --mount-path <path>``: mount the team's volume (the body given to
    the rent request)."""
    found = mount_of(body)
    if found is None:
        return body
    info, path = found
    if info.get("create_new"):
        raise Refused(
            "--create-volume makes one volume on one machine: create instance takes it, "
            "create instances does not.",
            field="create-volume",
        )
    volume_id = whole(info.get("volume_id"), "--link-volume", 1, MAX_ID)
    return {**body, "volumes": [{"volume": volume_id, "target": path}]}


def create_volume_for(view: Any, body: dict[str, Any], offer_id: int):
    """``--create-volume <volume offer> [--volume-size N] --mount-path <path>``: a new volume
    on the instance's machine, made on its host before the rental mounts it. Returns the body
    to rent with (linking the new volume) and the volume, or (body, None) when none is asked
    for. The volume offer must be the instance's machine: a volume mounts only there."""
    found = mount_of(body)
    if found is None or not found[0].get("create_new"):
        return body, None
    info, path = found
    offer = Offer.objects.filter(pk=offer_id).first()
    if offer is None:
        raise NotFound(f"There is no offer {offer_id}; search offers for current ids.")
    volume_offer = whole(info.get("volume_id"), "--create-volume", 1, MAX_ID)
    if volume_offer != offer.machine_id:
        raise Refused(
            f"--create-volume names volume offer {volume_offer}, but offer {offer_id} is on "
            f"machine {offer.machine_id}: a volume mounts only on its own machine, so use "
            f"volume offer {offer.machine_id}.",
            field="create-volume",
        )
    volume = new_volume(view, volume_offer, info.get("size", 15), info.get("name"))
    deadline = time.monotonic() + NEW_VOLUME_PATIENCE_S
    state = volume.state
    while state == VolumeState.CREATING and time.monotonic() < deadline:
        time.sleep(0.25)  # the worker makes it on the host (volume_build)
        state = Volume.objects.values_list("state", flat=True).get(pk=volume.pk)
    if state != VolumeState.READY:
        if state == VolumeState.CREATING:
            volume_delete(volume=volume)
        failure = Volume.objects.values_list("failure", flat=True).get(pk=volume.pk)
        raise VolumeNotReady(
            f"The host did not make the volume: {failure or 'it did not answer in time'}. "
            "Nothing was rented, and the volume is not charged."
        )
    linked = {**body, "volume_info": {**info, "create_new": False, "volume_id": volume.pk}}
    return with_linked_volume(linked), volume


def rent_with_volume(view: Any, offer_id: int, rent) -> Any:
    """``rent(body)`` with the body's new volume made first; a rental that fails deletes the
    volume it made, so nothing is left or charged."""
    body, volume = create_volume_for(view, view.body(), offer_id)
    if volume is None:
        return rent(body)
    try:
        return rent(body)
    except Exception:
        volume_delete(volume=Volume.objects.get(pk=volume.pk))
        raise
