"""The offer query language, in the style of vast.ai's search:

    num_gpus>=2 gpu_name=RTX_4090 reliability>0.98 dph_total<1.5 geolocation in [US,CA] -o dph_total

Terms are ``field op value`` with ``< <= = == != >= > in notin``; underscores in values stand
for spaces; ``field=any`` drops that field's filter (including a default one); ``-o a,b-``
sorts (a trailing ``-`` sorts descending; default: score, best first). Units: GB for memory
and disk, dollars for prices (``dph_total`` per hour for the offer's GPUs, ``dph_per_gpu`` per
GPU-hour, ``storage_cost`` per GB-month), days for ``duration``. An offer is a bundle of a
machine's GPUs (1, 2, 4…), and its figures are the bundle's. A bad query raises ``QueryError`` pointing at the token and saying why.

The same filters arrive as JSON in the API: ``{"num_gpus": {"gte": 2}, "geolocation":
{"in": ["US", "CA"]}}``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import ExpressionWrapper, F, FloatField, Q, QuerySet
from django.utils import timezone

from hosts.countries import country_code
from scheduler.placement import gpu_family_matches

MICRO = 1_000_000


@dataclass(frozen=True)
class FieldSpec:
    kind: str  # "int" | "float" | "str" | "gpu" | "bool" | "money" | "days"
    column: str  # model field or annotation
    help: str


# Annotations computed per offer (a bundle of ``num_gpus`` units).
ANNOTATIONS = {
    "gpu_total_ram": ExpressionWrapper(F("gpu_ram") * F("num_gpus"), output_field=FloatField()),
    "cpu_cores_effective": ExpressionWrapper(
        F("cpu_cores_per_unit") * F("num_gpus"), output_field=FloatField()
    ),
    "cpu_ram": ExpressionWrapper(F("cpu_ram_per_unit") * F("num_gpus"), output_field=FloatField()),
    "disk_space": ExpressionWrapper(F("disk_per_unit") * F("num_gpus"), output_field=FloatField()),
}

FIELDS: dict[str, FieldSpec] = {
    "id": FieldSpec("int", "id", "offer id (one GPU-count bundle of a machine)"),
    "gpu_name": FieldSpec("gpu", "gpu_name", "GPU model or family, e.g. RTX_4090 or A100"),
    "num_gpus": FieldSpec("int", "num_gpus", "GPUs of the offer (1, 2, 4… bundles)"),
    "gpu_ram": FieldSpec("float", "gpu_ram", "GB per GPU"),
    "gpu_total_ram": FieldSpec("float", "gpu_total_ram", "GB across the offer"),
    "cpu_cores_effective": FieldSpec("float", "cpu_cores_effective", "CPU cores of the offer"),
    "cpu_ram": FieldSpec("float", "cpu_ram", "GB of RAM of the offer"),
    "disk_space": FieldSpec("float", "disk_space", "GB of disk of the offer"),
    "disk_enforced": FieldSpec("bool", "disk_enforced", "a rental's disk is capped at its size"),
    "dph_total": FieldSpec("money", "dph_total", "dollars per hour for the offer's GPUs"),
    "dph_per_gpu": FieldSpec("money", "price_per_gpu_hour", "dollars per GPU-hour"),
    "storage_cost": FieldSpec("money", "storage_cost", "dollars per GB-month"),
    "reliability": FieldSpec("float", "reliability", "uptime score, 0..1"),
    "duration": FieldSpec(
        "days", "end_date", "days until the offer ends (end date or next maintenance)"
    ),
    "geolocation": FieldSpec(
        "str", "geolocation", "country (ISO 3166 code, e.g. US; a name like Germany works too)"
    ),
    "driver_version": FieldSpec("str", "driver_version", "NVIDIA driver version"),
    "cuda_max_good": FieldSpec("float", "cuda_max_good", "highest CUDA version supported"),
    "machine_id": FieldSpec("int", "machine_id", "machine id"),
    "host_id": FieldSpec("int", "provider_team_id", "the provider's (host's) id"),
    "cpu_cores": FieldSpec("int", "cpu_cores", "the machine's CPU cores"),
    "datacenter": FieldSpec("bool", "datacenter", "a certified datacenter (none is yet)"),
    "static_ip": FieldSpec("bool", "static_ip", "reached at a fixed IP address"),
    "direct_port_count": FieldSpec(
        "int", "direct_port_count", "host ports the machine publishes rentals' ports from"
    ),
    "verified": FieldSpec("bool", "verified", "machine passed verification"),
    "rentable": FieldSpec("bool", "rentable", "listed, online and the offer's GPUs free"),
    "rented": FieldSpec("bool", "rented", "some of the offer's GPUs are rented now"),
    "score": FieldSpec("float", "score", "value score (higher is better)"),
    "sharing": FieldSpec("bool", "sharing", "the machine rents slices of its cards"),
    "gpu_frac": FieldSpec("float", "gpu_frac", "largest free fraction of one card (slices)"),
    "slice_core_percent": FieldSpec(
        "int", "slice_core_percent", "most compute percent free on one card"
    ),
    "slice_memory_mb": FieldSpec("int", "slice_memory_mb", "most MB of memory free on one card"),
    "min_bid": FieldSpec(
        "money", "min_bid", "lowest bid per GPU-hour for an interruptible rental (unset: no bids)"
    ),
    # The machine's last passing benchmark (hosts.benchmark; GPU figures of simulated hosts
    # are their model's typical ones).
    "total_flops": FieldSpec("float", "total_flops", "FP32 TFLOPS of the offer's GPUs"),
    "compute_cap": FieldSpec("int", "compute_cap", "CUDA compute capability × 100, e.g. 890"),
    "gpu_mem_bw": FieldSpec("float", "gpu_mem_bw", "GB/s of one GPU's memory"),
    "dlperf": FieldSpec("float", "dlperf", "dlperf-style training score of the offer's GPUs"),
    "dlperf_per_dphtotal": FieldSpec("float", "dlperf_per_dphtotal", "dlperf per dollar-hour"),
    "inet_up": FieldSpec("float", "inet_up", "Mbit/s out of the host (measured)"),
    "inet_down": FieldSpec("float", "inet_down", "Mbit/s into the host (measured)"),
    "disk_bw": FieldSpec("float", "disk_bw", "MB/s read inside a rental's container"),
}

DEFAULT_FILTERS = {"rentable": ("=", True)}
DEFAULT_ORDER = [("score", True)]
OPERATORS = ["<=", ">=", "!=", "==", "<", ">", "="]
LOOKUPS = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte", "=": "exact", "==": "exact"}
JSON_OPERATORS = {
    "lt": "<", "lte": "<=", "gt": ">", "gte": ">=", "eq": "=", "neq": "!=", "in": "in",
    "notin": "notin", "nin": "notin",
}  # fmt: skip
MAX_NUMBER = 1e12
MAX_DAYS = 36_500  # a century: beyond it a date is out of the database's range anyway
DURATION_OPERATORS = ("<", "<=", ">", ">=")


class QueryError(ValueError):
    def __init__(self, reason: str, *, token: str = "", position: int | None = None):
        self.reason, self.token, self.position = reason, token, position
        if position is not None:
            where = f"at position {position} ('{token}'): "
        else:  # a JSON filter body has no positions; its token names the key (num_gpus.gte)
            where = f"at '{token}': " if token else ""
        super().__init__(where + reason)


@dataclass
class OfferQuery:
    filters: dict[str, tuple[str, Any] | None] = field(default_factory=dict)
    order: list[tuple[str, bool]] = field(default_factory=list)

    def effective_filters(self) -> dict[str, tuple[str, Any]]:
        merged: dict[str, tuple[str, Any] | None] = {**DEFAULT_FILTERS}
        merged.update(self.filters)
        return {name: f for name, f in merged.items() if f is not None}


# field, operator, value (a [list] or a bare word)
TERM = re.compile(
    r"(?P<field>[A-Za-z_][A-Za-z0-9_]*)\s*"
    r"(?:(?P<op><=|>=|!=|==|<|>|=)|\s+(?P<word>in|notin)\s*)\s*"
    r"(?P<value>\[[^\]]*\]|[^\s\[\]]+)?"
)
ORDER = re.compile(r"-o\s+(?P<value>[^\s]+)")


def parse(text: str) -> OfferQuery:
    query = OfferQuery()
    position = 0
    text = text or ""
    if len(text) > 2000:
        raise QueryError("the query is longer than 2000 characters")
    control = next((i for i, c in enumerate(text) if ord(c) < 32 and not c.isspace()), None)
    if control is not None:
        raise QueryError(
            "control characters are not allowed", token=repr(text[control]), position=control
        )
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        order = ORDER.match(text, position)
        if order:
            query.order = _parse_order(order.group("value"), order.start("value"))
            position = order.end()
            continue
        term = TERM.match(text, position)
        token = text[position:].split()[0]
        if not term:
            raise QueryError(
                "expected a term like num_gpus>=2 or geolocation in [US,CA]",
                token=token,
                position=position,
            )
        name = term.group("field")
        op = term.group("op") or term.group("word")
        raw = term.group("value")
        token = term.group(0)
        if raw is None:
            raise QueryError(f"'{name}{op}' has no value", token=token, position=position)
        query.filters[name] = _term(name, op, raw, token=token, position=position)
        position = term.end()
    return query


def parse_json(body: dict[str, Any]) -> OfferQuery:
    """``{"field": {"gte": 2}}`` or ``{"field": value}``; ``"order": [["dph_total", "asc"]]``."""
    if not isinstance(body, dict):
        raise QueryError("the filter body must be a JSON object")
    query = OfferQuery()
    for name, condition in body.items():
        if name in {"order", "limit", "offset", "q", "type"}:
            continue
        if not isinstance(condition, dict):
            condition = {"eq": condition}
        for json_op, value in condition.items():
            op = JSON_OPERATORS.get(json_op)
            if op is None:
                raise QueryError(f"unknown operator '{json_op}' for {name}", token=name)
            if isinstance(value, list):
                raw = "[" + ",".join(str(v) for v in value) + "]"
            else:
                raw = "any" if value is None else str(value).replace(" ", "_")
            query.filters[name] = _term(name, op, raw, token=f"{name}.{json_op}")
    order = body.get("order")
    if order:
        if not isinstance(order, list) or not all(
            isinstance(item, list) and len(item) == 2 and str(item[1]).lower() in ("asc", "desc")
            for item in order
        ):
            raise QueryError('order must be a list like [["dph_total", "asc"]]', token="order")
        query.order = [
            _order_field(str(name), str(direction).lower() == "desc", "order", None)
            for name, direction in order
        ]
    return query


def _parse_order(value: str, position: int) -> list[tuple[str, bool]]:
    fields = []
    for part in value.split(","):
        descending = part.endswith("-")
        fields.append(_order_field(part.rstrip("-"), descending, value, position))
    return fields


def _order_field(name: str, descending: bool, token: str, position: int | None):
    if name not in FIELDS:
        raise QueryError(f"cannot sort by unknown field '{name}'", token=token, position=position)
    return (name, descending)


def _term(name: str, op: str, raw: str, *, token: str, position: int | None = None):
    spec = FIELDS.get(name)
    if spec is None:
        known = ", ".join(sorted(FIELDS))
        raise QueryError(
            f"unknown field '{name}'; known fields: {known}", token=token, position=position
        )
    if raw.lower() == "any":
        return None
    if spec.kind == "days" and op not in DURATION_OPERATORS:
        # Days until an end date are a range question; "= 3" would match almost nothing.
        raise QueryError(
            f"{name} takes < <= > >= (days from now), not '{op}'", token=token, position=position
        )
    if op in ("in", "notin"):
        if not (raw.startswith("[") and raw.endswith("]")):
            raise QueryError(f"'{op}' needs a list like [US,CA]", token=token, position=position)
        items = [item.strip() for item in raw[1:-1].split(",") if item.strip()]
        if not items:
            raise QueryError(f"the list after '{op}' is empty", token=token, position=position)
        return (op, [_value(spec, name, item, token, position) for item in items])
    if raw.startswith("["):
        raise QueryError(
            f"a list needs 'in' or 'notin', not '{op}'", token=token, position=position
        )
    if spec.kind in ("str", "gpu", "bool") and op in ("<", "<=", ">", ">="):
        raise QueryError(f"'{op}' does not apply to {name}", token=token, position=position)
    return (op, _value(spec, name, raw, token, position))


def _value(spec: FieldSpec, name: str, raw: str, token: str, position: int | None):
    if spec.kind in ("str", "gpu"):
        if any(ord(c) < 32 for c in raw):
            raise QueryError(
                f"{name} must not contain control characters", token=token, position=position
            )
        if name == "geolocation":  # a country's name or alpha-3 code means its code
            return country_code(raw.replace("_", " ")) or raw.replace("_", " ")
        return raw.replace("_", " ")
    if spec.kind == "bool":
        lowered = raw.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise QueryError(f"{name} is true or false, not '{raw}'", token=token, position=position)
    try:
        number = float(raw)
    except ValueError:
        raise QueryError(
            f"{name} needs a number, not '{raw}'", token=token, position=position
        ) from None
    if not math.isfinite(number) or abs(number) > MAX_NUMBER:
        raise QueryError(f"{name} is out of range", token=token, position=position)
    if spec.kind == "int":
        if number != int(number):
            raise QueryError(f"{name} needs a whole number", token=token, position=position)
        return int(number)
    if spec.kind == "money":
        return round(number * MICRO)
    if spec.kind == "days" and abs(number) > MAX_DAYS:
        raise QueryError(
            f"{name} is out of range (at most {MAX_DAYS} days)", token=token, position=position
        )
    return number


def apply(queryset: QuerySet, query: OfferQuery) -> QuerySet:
    """Filter and sort an Offer queryset by the query (defaults included)."""
    query = resolve_families(query)
    filters = query.effective_filters()
    order = query.order or DEFAULT_ORDER
    needed = {name for name in filters if name in ANNOTATIONS}
    needed |= {name for name, _ in order if name in ANNOTATIONS}
    if needed:
        queryset = queryset.annotate(**{name: ANNOTATIONS[name] for name in needed})
    for name, (op, value) in filters.items():
        spec = GPU_MODEL if name == "gpu_model" else FIELDS[name]
        queryset = queryset.filter(_condition(spec, op, value))
    ordering = []
    for name, descending in order:
        column = FIELDS[name].column
        if FIELDS[name].kind == "days":  # longer duration = later end date; none = forever
            expression = (
                F(column).desc(nulls_first=True) if descending else F(column).asc(nulls_last=True)
            )
        else:
            expression = F(column).desc() if descending else F(column).asc()
        ordering.append(expression)
    return queryset.order_by(*ordering, "id")


def _condition(spec: FieldSpec, op: str, value: Any) -> Q:
    column = spec.column
    if spec.kind == "days":
        return _duration_condition(op, value)
    if op == "in":
        return _in(spec, column, value)
    if op == "notin":
        return ~_in(spec, column, value)
    if op == "!=":
        return ~_eq(spec, column, value)
    if op in ("=", "=="):
        return _eq(spec, column, value)
    return Q(**{f"{column}__{LOOKUPS[op]}": value})


def _eq(spec: FieldSpec, column: str, value: Any) -> Q:
    if spec.kind == "str":
        return Q(**{f"{column}__iexact": value})
    if spec.kind == "gpu":
        return _gpu_family(column, value)
    return Q(**{column: value})


def _in(spec: FieldSpec, column: str, values: list) -> Q:
    condition = Q(pk__in=[])
    for value in values:
        condition |= _eq(spec, column, value)
    return condition


# ``gpu_name=A100`` means the family, as deployment conditions do (``gpu_family_matches``):
# A100-SXM4-80GB and A100-PCIE-40GB; a full model name matches itself. A family is a prefix,
# and a prefix match (LIKE) cannot use the upper-cased GPU index under every collation, so
# a search of rentable offers first reads the few models the market lists (one index probe
# each, below) and asks for those by name (``gpu_model``): the indexed equality an exact name
# gets. Elsewhere (SQLite, ``rentable=any``) the family is matched by prefix.
RENTABLE_GPU_NAMES = """
WITH RECURSIVE names(name) AS (
    SELECT MIN(UPPER(gpu_name)) FROM marketplace_offer WHERE rentable
    UNION ALL
    SELECT (SELECT MIN(UPPER(gpu_name)) FROM marketplace_offer
            WHERE rentable AND UPPER(gpu_name) > names.name)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL
"""
# GPU models by exact name (case aside): what a family resolves to. Not a query field.
GPU_MODEL = FieldSpec("str", "gpu_name", "GPU models by exact name")
RESOLVED_OPERATORS = {"=": "in", "==": "in", "in": "in", "!=": "notin", "notin": "notin"}


def resolve_families(query: OfferQuery) -> OfferQuery:
    """The query with its ``gpu_name`` family replaced by the listed models of that family,
    where it searches rentable offers on PostgreSQL; otherwise the query as it is."""
    condition = query.filters.get("gpu_name")
    if not condition or connection.vendor != "postgresql":
        return query
    if query.effective_filters().get("rentable") != ("=", True):
        return query
    op, value = condition
    wanted = value if isinstance(value, list) else [value]
    with connection.cursor() as cursor:
        cursor.execute(RENTABLE_GPU_NAMES)
        listed = [row[0] for row in cursor.fetchall()]
    names = [n for n in listed if any(gpu_family_matches(w, n) for w in wanted)]
    filters = {name: f for name, f in query.filters.items() if name != "gpu_name"}
    # Nothing listed of the family: the names as typed, which match no rentable offer.
    filters["gpu_model"] = (RESOLVED_OPERATORS[op], names or wanted)
    return OfferQuery(filters=filters, order=query.order)


def _gpu_family(column: str, wanted: str) -> Q:
    wanted = wanted.strip()
    return (
        Q(**{f"{column}__iexact": wanted})
        | Q(**{f"{column}__istartswith": f"{wanted}-"})
        | Q(**{f"{column}__istartswith": f"{wanted} "})
    )


def _duration_condition(op: str, days: float) -> Q:
    """``duration>=7``: the machine stays rentable at least 7 more days (no end date = forever).

    ``_term`` admits only the range operators for days, so the error below is a backstop.
    """
    moment = timezone.now() + timedelta(days=days)
    forever = Q(end_date__isnull=True)
    if op in (">", ">="):
        return forever | Q(**{f"end_date__{LOOKUPS[op]}": moment})
    if op in ("<", "<="):
        return Q(**{f"end_date__{LOOKUPS[op]}": moment})
    raise QueryError(f"duration takes < <= > >=, not '{op}'", token="duration")
