"""REST API for renters: offer search (the query language, or a JSON filter body) and the
quote before renting."""

from __future__ import annotations

import time
from collections.abc import Mapping

from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.renderers import BrowsableAPIRenderer
from rest_framework.response import Response

from billing.usd import MICRO_PER_DOLLAR
from marketplace import offer_index, offer_query
from marketplace.api import offer_statements
from marketplace.api.fields import DOLLARS_SCHEMA, DollarsField, FiniteFloatField, dollars
from marketplace.api.permissions import read_only_methods
from marketplace.api.renderers import FastJSONRenderer
from marketplace.api.throttling import throttle_scope
from marketplace.models import Offer
from marketplace.rentals.renting import MAX_RENTAL_HOURS, MIN_RENTAL_HOURS
from marketplace.services.offer_figures import BENCHMARK_FIELDS
from marketplace.services.pricing import rental_quote

MAX_PAGE = 256
MAX_OFFSET = 10_000


class OfferSerializer(serializers.ModelSerializer):
    """An offer: a bundle of ``num_gpus`` GPUs of one machine; its figures are the bundle's
    (``dph_total`` is what renting it costs per hour, ``dph_per_gpu`` per GPU)."""

    id = serializers.IntegerField()
    machine_id = serializers.IntegerField()
    host_id = serializers.IntegerField(source="provider_team_id")
    gpu_total_ram = serializers.SerializerMethodField()
    cpu_cores_effective = serializers.SerializerMethodField()
    cpu_ram = serializers.SerializerMethodField()
    disk_space = serializers.SerializerMethodField()
    dph_total = serializers.SerializerMethodField()
    dph_per_gpu = serializers.SerializerMethodField()
    storage_cost = serializers.SerializerMethodField()
    duration = serializers.SerializerMethodField()
    min_bid = serializers.SerializerMethodField()

    class Meta:
        model = Offer
        fields = [
            "id", "machine_id", "host_id", "gpu_name", "num_gpus", "total_gpus", "min_gpus",
            "gpu_ram", "gpu_total_ram", "cpu_cores", "cpu_cores_effective", "cpu_ram",
            "disk_space", "disk_enforced", "dph_total", "dph_per_gpu", "storage_cost",
            "reliability", "duration", "end_date", "geolocation", "driver_version",
            "cuda_max_good", "verified", "rentable", "rented", "datacenter", "static_ip",
            "direct_port_count", "score",
            "sharing", "gpu_frac", "slice_core_percent", "slice_memory_mb",
            "min_slice_core_percent", "cards", "min_bid", *BENCHMARK_FIELDS,
        ]  # fmt: skip

    def get_gpu_total_ram(self, offer) -> float:
        return round(offer.gpu_ram * offer.num_gpus, 2)

    def get_cpu_cores_effective(self, offer) -> float:
        return round(offer.cpu_cores_per_unit * offer.num_gpus, 2)

    def get_cpu_ram(self, offer) -> float:
        return round(offer.cpu_ram_per_unit * offer.num_gpus, 2)

    def get_disk_space(self, offer) -> float:
        return round(offer.disk_per_unit * offer.num_gpus, 1)

    @extend_schema_field(DOLLARS_SCHEMA)
    def get_dph_total(self, offer) -> str:
        return dollars(offer.dph_total)

    @extend_schema_field(DOLLARS_SCHEMA)
    def get_dph_per_gpu(self, offer) -> str:
        return dollars(offer.price_per_gpu_hour)

    @extend_schema_field(DOLLARS_SCHEMA)
    def get_storage_cost(self, offer) -> str:
        return dollars(offer.storage_cost)

    @extend_schema_field({**DOLLARS_SCHEMA, "nullable": True})
    def get_min_bid(self, offer) -> str | None:
        """The lowest bid per GPU-hour that rents these GPUs interruptibly (None: the machine
        takes no bids)."""
        return dollars(offer.min_bid)

    def get_duration(self, offer) -> float | None:
        """Days until the offer ends: the machine's end date or its next maintenance window,
        whichever comes first (None: neither)."""
        return days_until(offer.end_date, timezone.now())

    def to_representation(self, offer: Offer) -> dict:
        """The declared fields' values, built in one go (``offer_json``; a test holds the
        two to each other)."""
        return offer_json(vars(offer), timezone.now())


# The columns a search reads for its page (``offer_json``), fetched as rows: building a model
# instance for each of a page's 64 offers cost more than the query itself.
OFFER_COLUMNS = (
    "id", "machine_id", "provider_team_id", "gpu_name", "num_gpus", "total_gpus", "min_gpus", "gpu_ram",
    "cpu_cores_per_unit", "cpu_ram_per_unit", "disk_per_unit", "disk_enforced",
    "price_per_gpu_hour", "dph_total", "storage_cost", "reliability", "end_date", "geolocation",
    "driver_version", "cuda_max_good", "verified", "rentable", "score", "sharing", "gpu_frac",
    "slice_core_percent", "slice_memory_mb", "min_slice_core_percent", "cards", "min_bid",
    "rented", "cpu_cores", "datacenter", "static_ip", "direct_port_count",
    *BENCHMARK_FIELDS,
)  # fmt: skip


def offer_json(offer: Mapping, now) -> dict:
    """An offer's API representation from its columns (``OFFER_COLUMNS``); figures are for its
    bundle of ``num_gpus`` GPUs. ``now`` is the moment its ``duration`` counts from."""
    return offers_json({name: [offer[name]] for name in OFFER_COLUMNS}, now)[0]


def offers_json(columns: Mapping[str, list], now) -> list[dict]:
    """A page of offers' API representations (``offer_json``) from a list of values per
    column: built a field at a time over the page, not an offer at a time, which read each
    of some 40 columns out of a dict 64 or 256 times."""
    units = columns["num_gpus"]
    end_dates = columns["end_date"]
    fields = {
        "id": columns["id"],
        "machine_id": columns["machine_id"],
        "host_id": columns["provider_team_id"],
        "gpu_name": columns["gpu_name"],
        "num_gpus": units,
        "total_gpus": columns["total_gpus"],
        "min_gpus": columns["min_gpus"],
        "gpu_ram": _floats(columns["gpu_ram"]),
        "gpu_total_ram": _per_bundle(columns["gpu_ram"], units, 2),
        "cpu_cores": columns["cpu_cores"],
        "cpu_cores_effective": _per_bundle(columns["cpu_cores_per_unit"], units, 2),
        "cpu_ram": _per_bundle(columns["cpu_ram_per_unit"], units, 2),
        "disk_space": _per_bundle(columns["disk_per_unit"], units, 1),
        "disk_enforced": columns["disk_enforced"],
        "dph_total": [_dollars(micro) for micro in columns["dph_total"]],
        "dph_per_gpu": [_dollars(micro) for micro in columns["price_per_gpu_hour"]],
        "storage_cost": [_dollars(micro) for micro in columns["storage_cost"]],
        "reliability": _floats(columns["reliability"]),
        "duration": [days_until(end, now) for end in end_dates],
        "end_date": _isos(end_dates),
        "geolocation": columns["geolocation"],
        "driver_version": columns["driver_version"],
        "cuda_max_good": _floats(columns["cuda_max_good"]),
        "verified": columns["verified"],
        "rentable": columns["rentable"],
        "rented": columns["rented"],
        "datacenter": columns["datacenter"],
        "static_ip": columns["static_ip"],
        "direct_port_count": columns["direct_port_count"],
        "score": _floats(columns["score"]),
        "sharing": columns["sharing"],
        "gpu_frac": _floats(columns["gpu_frac"]),
        "slice_core_percent": columns["slice_core_percent"],
        "slice_memory_mb": columns["slice_memory_mb"],
        "min_slice_core_percent": columns["min_slice_core_percent"],
        "cards": columns["cards"],
        "min_bid": [_dollars(micro) for micro in columns["min_bid"]],
        **{name: columns[name] for name in BENCHMARK_FIELDS},
    }
    names = tuple(fields)
    return [dict(zip(names, offer, strict=True)) for offer in zip(*fields.values(), strict=True)]


def _floats(values: list) -> list[float]:
    return [float(value) for value in values]


def _per_bundle(per_unit: list, units: list[int], digits: int) -> list[float]:
    """A per-GPU figure times each offer's GPUs, rounded as the API writes it."""
    return [round(value * count, digits) for value, count in zip(per_unit, units, strict=True)]


def _isos(moments: list) -> list[str | None]:
    """Dates as DRF's ``DateTimeField`` writes every other date of the API (in the current
    time zone, UTC as ``Z``; None stays None), without a field's checks for each of a page's
    offers. The zone is looked up once a page: each look-up reads the request's context."""
    zone = timezone.get_current_timezone()
    texts: list[str | None] = []
    for moment in moments:
        text = moment.astimezone(zone).isoformat() if moment else None
        texts.append(text[:-6] + "Z" if text and text.endswith("+00:00") else text)
    return texts


def _dollars(micro: int | None) -> str | None:
    """``dollars`` for a column's micro-dollars, the same text: four of them an offer, 256 a
    page, and most are not negative (the sign needs the general form)."""
    if micro is None:
        return None
    if micro >= 0:
        return f"{micro // MICRO_PER_DOLLAR}.{micro % MICRO_PER_DOLLAR:06d}"
    return dollars(micro)


def days_until(end_date, now) -> float | None:
    """Days from ``now`` until an offer's end (None: it has none)."""
    if end_date is None:
        return None
    return round(max((end_date - now).total_seconds(), 0) / 86400, 2)


def search_offers(query: offer_query.OfferQuery, limit: int, offset: int) -> list[Offer]:
    """A page of the search's offers as model instances (the v0 API's searches)."""
    ids = offer_index.page_ids(query, limit, offset)
    if ids is None:
        return list(offer_query.apply(Offer.objects.all(), query)[offset : offset + limit])
    found = Offer.objects.in_bulk(ids)
    return [found[pk] for pk in ids if pk in found]  # one gone since is left out


def search_offer_columns(query: offer_query.OfferQuery, limit: int, offset: int) -> dict[str, list]:
    """``search_offer_rows`` as a list of values per column, for ``offers_json``."""
    return offer_statements.search_columns(query, OFFER_COLUMNS, limit, offset)


def search_offer_rows(query: offer_query.OfferQuery, limit: int, offset: int) -> list[dict]:
    """``search_offers``, as rows of ``OFFER_COLUMNS`` for ``offer_json`` (the statement
    compiled once per shape of search: ``offer_statements``)."""
    return offer_statements.search_rows(query, OFFER_COLUMNS, limit, offset)


class OfferPageSerializer(serializers.Serializer):
    limit = serializers.IntegerField(
        min_value=1,
        max_value=MAX_PAGE,
        default=64,
        error_messages={
            "min_value": f"Between 1 and {MAX_PAGE}.",
            "max_value": f"Between 1 and {MAX_PAGE}.",
        },
    )
    # Deeper pages cost the database a scan past every skipped row; a narrower query finds
    # the same offers without one.
    offset = serializers.IntegerField(
        min_value=0,
        max_value=MAX_OFFSET,
        default=0,
        error_messages={
            "min_value": "Must not be negative.",
            "max_value": f"Pages go at most {MAX_OFFSET} offers deep; narrow the query instead.",
        },
    )


# The page's two fields, validated one by one as the serializer would (the same errors): a
# serializer made for each search copies its fields, which cost more than the search's filters.
_PAGE_FIELDS = OfferPageSerializer().fields


def _page_params(data) -> tuple[int, int]:
    values, errors = {}, {}
    for name, field in _PAGE_FIELDS.items():
        try:
            values[name] = field.run_validation(data[name]) if name in data else field.default
        except serializers.ValidationError as error:
            errors[name] = error.detail
    if errors:
        raise serializers.ValidationError(errors)
    return values["limit"], values["offset"]


def _offer_query(request) -> tuple[offer_query.OfferQuery, str]:
    """The query of a GET (``q=``) or a POST (JSON filter body, or ``{"q": …}``), and the
    field a bad one is reported under."""
    if request.method == "GET":
        return offer_query.parse(request.query_params.get("q", "")), "q"
    if "q" in request.data:
        text = request.data["q"]
        if not isinstance(text, str):
            raise serializers.ValidationError({"q": "The query is text, like 'num_gpus>=2'."})
        return offer_query.parse(text), "q"
    return offer_query.parse_json(request.data), "filters"


class OfferResultsSerializer(serializers.Serializer):
    offers = OfferSerializer(many=True)
    next_offset = serializers.IntegerField(
        allow_null=True, help_text="The offset of the next page; null on the last page."
    )


OFFER_FILTER_BODY = {
    "type": "object",
    "description": 'Filters by field, like {"num_gpus": {"gte": 2}, "geolocation": {"in": '
    '["US", "CA"]}}; or {"q": "num_gpus>=2 -o dph_total"}; "order": [["dph_total", "asc"]].',
    "properties": {
        "q": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 64},
        "offset": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "default": 0},
    },
    "additionalProperties": True,
}


@read_only_methods("POST")  # a search with a JSON body: read-only keys and viewers may use it
@throttle_scope("offer_search")
@extend_schema(
    methods=["GET"],
    summary="Search offers",
    parameters=[
        OpenApiParameter("q", str, description="e.g. num_gpus>=2 gpu_name=RTX_4090 -o dph_total"),
        OpenApiParameter("limit", int, description=f"1..{MAX_PAGE} (default 64)"),
        OpenApiParameter("offset", int, description=f"0..{MAX_OFFSET}"),
    ],
    responses=OfferResultsSerializer,
)
@extend_schema(
    methods=["POST"],
    summary="Search offers with a JSON filter body",
    request={"application/json": OFFER_FILTER_BODY},
    responses=OfferResultsSerializer,
)
@api_view(["GET", "POST"])
@renderer_classes([FastJSONRenderer, BrowsableAPIRenderer])
def offers(request):
    """GET with ``q=`` (query language) or POST a JSON filter body (``{"num_gpus": {"gte": 2}}``).

    A bad query answers 400 naming the position and token and saying why; nothing about a
    query can make this a 500.
    """
    data = request.data if request.method == "POST" else request.query_params
    if not isinstance(data, Mapping):
        raise serializers.ValidationError(
            {"filters": 'The filter body is a JSON object, like {"num_gpus": {"gte": 2}}.'}
        )
    limit, offset = _page_params(data)
    field = "q" if request.method == "GET" or "q" in data else "filters"
    try:
        query, field = _offer_query(request)
        started = time.perf_counter()
        found = search_offer_columns(query, limit + 1, offset)
        searched = (time.perf_counter() - started) * 1000
    except offer_query.QueryError as error:
        raise serializers.ValidationError({field: str(error)}) from error
    more = len(found["id"]) > limit
    if more:
        found = {name: values[:limit] for name, values in found.items()}
    return Response(
        {
            "offers": offers_json(found, timezone.now()),
            "next_offset": offset + limit if more else None,
        },
        # Beside the whole answer's ``app`` (core/server_timing.py): the search's own work,
        # finding the page (the offer index, or SQL) and reading its rows.
        headers={"Server-Timing": f"search;dur={searched:.2f}"},
    )


class QuoteSerializer(serializers.Serializer):
    num_gpus = serializers.IntegerField(min_value=1, max_value=64)
    duration_hours = FiniteFloatField(min_value=MIN_RENTAL_HOURS, max_value=MAX_RENTAL_HOURS)
    disk_gb = serializers.IntegerField(min_value=1, max_value=100_000, default=10)


class QuoteResultSerializer(serializers.Serializer):
    gpu = DollarsField(help_text="Dollars held for GPU time.")
    storage = DollarsField(help_text="Dollars held for storage.")
    total = DollarsField(help_text="Dollars held in all.")
    disk_enforced = serializers.BooleanField(
        help_text="Whether the host caps the container's disk at disk_gb."
    )
    disk_note = serializers.CharField(help_text="What disk_gb means on this host, in words.")


@extend_schema(
    summary="Price of a rental before confirming",
    parameters=[QuoteSerializer],
    responses=QuoteResultSerializer,
)
@api_view(["GET"])
def offer_quote(request, machine_id: int):
    offer = (
        Offer.objects.select_related("machine").filter(machine_id=machine_id, all_free=True).first()
    )
    if offer is None:
        raise Http404
    params = QuoteSerializer(data=request.query_params)
    params.is_valid(raise_exception=True)
    quote = rental_quote(
        machine=offer.machine,
        gpu_count=params.validated_data["num_gpus"],
        disk_gb=params.validated_data["disk_gb"],
        hours=params.validated_data["duration_hours"],
    )
    return Response(
        {
            "gpu": dollars(quote.gpu),
            "storage": dollars(quote.storage),
            "total": dollars(quote.total),
            "disk_enforced": offer.machine.disk_enforced,
            "disk_note": disk_note(offer.machine.disk_enforced),
        }
    )


def disk_note(enforced: bool) -> str:
    """What a rental's ``disk_gb`` means on a host, told before renting."""
    if enforced:
        return "The container's disk is capped at disk_gb: writes past it fail (no space left)."
    return (
        "This host does not enforce disk sizes: disk_gb is charged and recorded, but the "
        "container can write past it."
    )
