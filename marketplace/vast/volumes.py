"""``vastai search/create/show/delete volume(s)`` and ``create instance --create-volume /
--link-volume``, over the volumes of /api/v1/volumes/ (marketplace/rentals/volumes.py).

vast.ai's volume offer is a slice of a machine's disk a host lists for volumes; here every
listed machine offers the part of its free disk no volume has been promised, at its storage
price. So a volume offer is a machine: its id is the machine's id (as ``machine_id`` is too),
``disk_space`` the GB a new volume there may take, ``storage_cost`` its $/GB/month. A vast user
reads the same thing from the table: where a volume can go, how big, at what price, and
``create volume <offer id>`` puts it there. A volume here lives on that one machine and is
mounted by rentals on it, as vast.ai's local volumes are; there are no network volumes.

vast.ai keeps a volume until it is deleted; ours is held (and charged) for a period. The CLI's
volumes are held for 30 days, or until the machine's end date when that comes sooner, and are
extended through /api/v1/volumes/<id>/extend/.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from billing.money import MICRO_PER_DOLLAR
from hosts.models import Machine, MachineStatus
from hosts.runtime.volumes import MAX_VOLUME_GB
from marketplace.models import Offer, Volume, VolumeState
from marketplace.models.rentals import all_free_offers, machine_offer
from marketplace.rentals.volumes import (
    volume_clone,
    volume_delete,
    volume_room_gb,
)
from marketplace.tenancy import team_objects
from marketplace.url_ids import MAX_ID
from marketplace.vast import shapes
from marketplace.vast.errors import Refused
from marketplace.vast.views import ANY_JSON, RenterView
from marketplace.vast.volume_mounts import new_volume, volume_hours, whole

# vast.ai's query operators, as the CLI's parse_query writes them.
OPERATORS = {
    "eq": lambda have, want: have == want,
    "neq": lambda have, want: have != want,
    "gt": lambda have, want: have is not None and have > want,
    "gte": lambda have, want: have is not None and have >= want,
    "lt": lambda have, want: have is not None and have < want,
    "lte": lambda have, want: have is not None and have <= want,
    "in": lambda have, want: have in want,
    "notin": lambda have, want: have not in want,
}


# --- volume offers ---------------------------------------------------------------------------


def offer_row(machine: Machine) -> dict[str, Any]:
    """A machine as ``search volumes`` reads a volume offer."""
    offer = machine_offer(machine)
    base = shapes.offer_row(offer) if isinstance(offer, Offer) else {}
    keep = (
        "cuda_max_good", "driver_version", "inet_up", "inet_down", "disk_bw", "gpu_name",
        "total_flops", "static_ip", "datacenter", "score",
    )  # fmt: skip
    return {
        **{key: base.get(key) for key in keep},
        "id": machine.pk,
        "ask_contract_id": machine.pk,
        "machine_id": machine.pk,
        "host_id": machine.team_id,
        "disk_space": float(volume_room_gb(machine)),
        "storage_cost": machine.storage_price_per_gb_month / MICRO_PER_DOLLAR,
        "reliability": float(machine.reliability),
        "reliability2": float(machine.reliability),
        "geolocation": machine.location,
        "duration": shapes.seconds_until(machine.end_date),
        "end_date": machine.end_date.timestamp() if machine.end_date else None,
        "verified": True,
        "verification": "verified",
        "external": False,
        "rentable": True,
    }


NUMBER, TEXT, FLAG = "a number", "text", "true or false"
# The fields of a volume offer, and what their values are.
OFFER_FIELDS = {
    "id": NUMBER, "ask_contract_id": NUMBER, "machine_id": NUMBER, "host_id": NUMBER,
    "disk_space": NUMBER, "storage_cost": NUMBER, "reliability": NUMBER, "reliability2": NUMBER,
    "duration": NUMBER, "end_date": NUMBER, "cuda_max_good": NUMBER, "inet_up": NUMBER,
    "inet_down": NUMBER, "disk_bw": NUMBER, "total_flops": NUMBER, "score": NUMBER,
    "geolocation": TEXT, "driver_version": TEXT, "gpu_name": TEXT, "verification": TEXT,
    "verified": FLAG, "external": FLAG, "rentable": FLAG, "static_ip": FLAG, "datacenter": FLAG,
}  # fmt: skip


def is_kind(value: Any, kind: str) -> bool:
    if kind == FLAG:
        return isinstance(value, bool)
    if kind == TEXT:
        return isinstance(value, str)
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def as_kind(value: Any, kind: str) -> Any:
    """The CLI's parse_query sends numbers as it read them, as text ("1", "5.5"): a number
    field takes those as numbers."""
    if kind == NUMBER and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def query_check(query: dict[str, Any]) -> dict[str, Any]:
    """Each condition names a field of a volume offer, a known operator and values of the
    field's kind: 400 naming the field otherwise. Returns the query with numbers as numbers."""
    checked: dict[str, Any] = {}
    for name, condition in query.items():
        kind = OFFER_FIELDS.get(name)
        if kind is None:
            raise Refused(
                f"unknown field {str(name)[:40]!r}: volume offers here have "
                f"{', '.join(sorted(OFFER_FIELDS))}.",
                field=str(name)[:40],
            )
        if not isinstance(condition, dict) or not condition:
            raise Refused(f"{name}: a condition like {{'gte': 10}}.", field=name)
        for op, wanted in condition.items():
            if op not in OPERATORS:
                raise Refused(f"{name}: unknown operator {str(op)[:20]!r}.", field=name)
            many = op in ("in", "notin")
            values = wanted if many else [wanted]
            if isinstance(values, list):
                values = [as_kind(value, kind) for value in values]
            if not isinstance(values, list) or not all(is_kind(v, kind) for v in values):
                also = " (a list of them)" if many else ""
                raise Refused(f"{name} {op}: {kind}{also}.", field=name)
            checked.setdefault(name, {})[op] = values if many else values[0]
    return checked


def matches(row: dict[str, Any], query: dict[str, Any]) -> bool:
    return all(
        OPERATORS[op](row[name], wanted)
        for name, condition in query.items()
        for op, wanted in condition.items()
    )


def ordered(rows: list[dict[str, Any]], order: Any) -> list[dict[str, Any]]:
    if order in (None, []):
        return rows
    if not isinstance(order, list) or not all(
        isinstance(pair, list)
        and len(pair) == 2
        and isinstance(pair[0], str)
        and pair[1] in ("asc", "desc")
        for pair in order
    ):
        raise Refused('order is a list of [field, "asc" or "desc"].', field="order")
    for name, direction in reversed(order):
        if name not in OFFER_FIELDS:
            raise Refused(f"unknown field {str(name)[:40]!r} to order by.", field="order")
        present = [row for row in rows if row.get(name) is not None]
        absent = [row for row in rows if row.get(name) is None]
        present.sort(key=lambda row: row[name], reverse=direction == "desc")
        rows = present + absent  # no value sorts last either way
    return rows


class VolumeSearch(RenterView):
    """``vastai search volumes``: where a volume can go (see the module's note)."""

    read_only_methods = frozenset({"POST"})  # a search with a JSON body
    throttle_scope = "offer_search"

    @extend_schema(
        summary="vast.ai: search volumes",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request):
        query = dict(self.body())
        order = query.pop("order", None)
        limit = query.pop("limit", 64)
        storage = query.pop("allocated_storage", 1.0)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
            raise Refused("--limit is between 1 and 1000.", field="limit")
        if (
            not isinstance(storage, int | float)
            or isinstance(storage, bool)
            or not math.isfinite(storage)
            or storage < 0
        ):
            raise Refused("--storage is a number of GB.", field="storage")
        machines = (
            Machine.objects.filter(listed=True, status=MachineStatus.ONLINE)
            .prefetch_related(all_free_offers())
            .order_by("pk")
        )
        query = query_check(query)
        found = [row for row in map(offer_row, machines) if matches(row, query)]
        return Response({"offers": ordered(found, order)[:limit]})


# --- the team's volumes ----------------------------------------------------------------------


def volume_row(volume: Volume) -> dict[str, Any]:
    """A volume as ``show volumes`` reads it (``start_date`` is required by the CLI)."""
    machine = volume.machine
    return {
        "id": volume.pk,
        "label": volume.name,
        "name": volume.name,
        "disk_space": float(volume.size_gb),
        "status": volume.state,
        "machine_id": volume.machine_id,
        "host_id": volume.provider_team_id,
        "geolocation": machine.location,
        "reliability2": float(machine.reliability),
        "storage_cost": volume.storage_price_per_gb_month / MICRO_PER_DOLLAR,
        "start_date": volume.created_at.timestamp(),
        "end_date": volume.ends_at.timestamp(),
        "instances": sorted(
            mount.instance_id
            for mount in volume.mounts.all()
            if mount.instance.state != "destroyed"
        ),
        "verification": "verified",
    }


def team_volumes(team):
    return team_objects(
        team,
        Volume.objects.exclude(state=VolumeState.DELETED)
        .select_related("machine")
        .prefetch_related("mounts__instance"),
    )


class Volumes(RenterView):
    """``show volumes`` (GET), ``create volume`` (PUT), ``delete volume`` (DELETE ?id=); a
    host's ``list volume(s)`` (POST) is refused."""

    def team_volumes(self):
        return team_volumes(self.team)

    @extend_schema(summary="vast.ai: show volumes", responses={200: ANY_JSON})
    def get(self, request):
        kind = request.query_params.get("type", "all_volume")
        if kind not in ("all_volume", "local_volume", "network_volume"):
            raise Refused('--type is "local", "network" or "all".', field="type")
        if kind == "network_volume":  # none here: every volume is on its machine's disk
            return Response({"volumes": []})
        return Response({"volumes": [volume_row(v) for v in self.team_volumes().order_by("pk")]})

    @extend_schema(
        summary="vast.ai: create volume",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request):
        body = self.body()
        volume = new_volume(self, body.get("id"), body.get("size", 15), body.get("name"))
        return Response(
            {
                "success": True,
                "volume_id": volume.pk,
                "id": volume.pk,
                "name": volume.name,
                "size": volume.size_gb,
                "status": volume.state,
            }
        )

    @extend_schema(
        summary="vast.ai: list volume (not offered)",
        request={"application/json": ANY_JSON},
        responses={400: ANY_JSON},
    )
    def post(self, request):
        raise Refused(
            "list volume is not offered: a listed machine's free disk is offered for volumes "
            "already (search volumes shows it, at the storage price that list machine -s sets).",
            field="machine",
        )

    @extend_schema(summary="vast.ai: delete volume", responses={200: ANY_JSON})
    def delete(self, request):
        raw = request.query_params.get("id", "")
        if not raw.isdigit() or len(raw) > 18:
            raise Refused("id is the volume's id, a whole number.", field="id")
        volume = self.team_volumes().filter(pk=int(raw)).first()
        if volume is None:
            raise NotFound(f"Volume {raw} is not one of your team's volumes.")
        volume_delete(volume=volume)
        return Response({"success": True, "msg": f"Volume {volume.pk} deleted."})


class VolumeClone(RenterView):
    """``vastai clone volume <volume id> <volume offer id> [--size GB]``: a new volume of the
    team with a copy of the volume's files, on the same machine (a volume here lives on its
    machine's disk, so the offer is the source's own machine: its id is the machine's). Held
    as ``create volume``'s are; ``show volumes`` shows it ``creating`` until its host has
    made and filled it."""

    @extend_schema(
        summary="vast.ai: clone volume",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request):
        body = self.body()
        source_id = whole(body.get("src_id"), "src_id", 1, MAX_ID)
        offer_id = whole(body.get("dst_id"), "dst_id", 1, MAX_ID)
        size = body.get("size")
        size_gb = None if size is None else whole(size, "--size", 1, MAX_VOLUME_GB)
        if body.get("disable_compression") not in (None, False, True):
            raise Refused("disable_compression is true or false.", field="disable_compression")
        source = team_volumes(self.team).filter(pk=source_id).first()
        if source is None:
            raise NotFound(f"Volume {source_id} is not one of your team's volumes.")
        if offer_id != source.machine_id:
            raise Refused(
                f"A clone is made on its volume's machine: use volume offer "
                f"{source.machine_id} (a volume here lives on one machine's disk).",
                field="dst_id",
            )
        membership = getattr(request, "membership", None)
        clone = volume_clone(
            source=source,
            user=membership.user if membership is not None else None,
            name=f"{source.name[:50]}-clone-{uuid.uuid4().hex[:4]}",
            size_gb=size_gb,
            hours=volume_hours(source.machine_id),
        )
        return Response(
            {
                "success": True,
                "volume_id": clone.pk,
                "id": clone.pk,
                "name": clone.name,
                "size": clone.size_gb,
                "status": clone.state,
                "cloned_from": source.pk,
            }
        )
