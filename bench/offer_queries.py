"""Offer searches drawn by a seeded random generator over the whole query language.

Every field of ``marketplace.offer_query.FIELDS`` and every operator a field's kind takes
(``< <= = == != >= > in notin``; ``duration`` only the ranges; words and true/false no
ranges), with values drawn from what the bench seeds (``offer_search.populate``) and now
and then one nothing matches, ``field=any`` (``rentable=any`` drops the default filter),
sorts on any field either way, pages of 1 to 256 from offset 0 to 10,000. A fifth of the
searches go as a JSON filter body (``POST``), as the API's other form.

The same seed gives the same searches, so two runs time the same work. Query ``n`` leads
with field ``n`` (mod the fields) and that field's next operator, so a few hundred searches
hold every field with every operator it takes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from marketplace import offer_query
from marketplace.api.offers import MAX_OFFSET, MAX_PAGE

RANGES = ["<", "<=", ">", ">="]
EQUALS = ["=", "==", "!="]
LISTS = ["in", "notin"]
JSON_OPERATORS = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte", "=": "eq", "==": "eq",
                  "!=": "neq", "in": "in", "notin": "notin"}  # fmt: skip


def operators(kind: str) -> list[str]:
    """The operators the query language takes for a field of ``kind``."""
    if kind == "days":
        return list(offer_query.DURATION_OPERATORS)
    if kind in ("str", "gpu", "bool"):  # words, GPU models and families, true/false
        return EQUALS + LISTS
    return RANGES + EQUALS + LISTS


@dataclass(frozen=True)
class Bounds:
    """What the seeded database holds, for values that hit: its offer and machine ids, its
    provider's team id, its GPU models and regions."""

    offer_ids: tuple[int, int]
    machine_ids: tuple[int, int]
    host_id: int
    gpu_names: tuple[str, ...]
    regions: tuple[str, ...]
    drivers: tuple[str, ...]


@dataclass(frozen=True)
class Search:
    """One search: the query text, or its JSON filter body when ``body`` is set; a page."""

    q: str
    limit: int
    offset: int
    body: dict | None = field(default=None, hash=False, compare=False)

    @property
    def method(self) -> str:
        return "GET" if self.body is None else "POST"

    def label(self) -> str:
        page = f"limit={self.limit} offset={self.offset}"
        return f"{self.method} {self.q or '(no filter)'} [{page}]"


def _number(rng: random.Random, kind: str, low: float, high: float, places: int = 2):
    if kind == "int":
        return rng.randint(int(low), int(high))
    return round(rng.uniform(low, high), places)


def value(rng: random.Random, name: str, bounds: Bounds):
    """A value for a term on ``name``: mostly within what the seed holds, sometimes not."""
    spec = offer_query.FIELDS[name]
    if spec.kind == "bool":
        return rng.random() < 0.5
    if name == "gpu_name":
        return rng.choice([*bounds.gpu_names, "RTX 5090"])  # one no machine has
    if name == "geolocation":
        return rng.choice([*bounds.regions, "AF"])
    if name == "driver_version":
        return rng.choice([*bounds.drivers, "470.57.02"])
    ranges = {
        "id": bounds.offer_ids, "machine_id": bounds.machine_ids,
        "host_id": (bounds.host_id - 1, bounds.host_id + 1),
        "num_gpus": (1, 8), "gpu_ram": (16, 96), "gpu_total_ram": (16, 700),
        "cpu_cores_effective": (2, 130), "cpu_ram": (16, 800), "disk_space": (50, 4500),
        "dph_total": (0.1, 25), "dph_per_gpu": (0.1, 4.5), "storage_cost": (0.03, 0.2),
        "reliability": (0.8, 1.0), "duration": (1, 400), "cuda_max_good": (11.5, 12.6),
        "cpu_cores": (4, 130), "direct_port_count": (5, 1200), "score": (0, 800),
        "gpu_frac": (0, 1), "slice_core_percent": (0, 100), "slice_memory_mb": (0, 80_000),
        "min_bid": (0.05, 4), "total_flops": (10, 750), "compute_cap": (700, 910),
        "gpu_mem_bw": (500, 3500), "dlperf": (20, 1000), "dlperf_per_dphtotal": (5, 400),
        "inet_up": (50, 12_000), "inet_down": (50, 12_000), "disk_bw": (100, 6000),
    }  # fmt: skip
    low, high = ranges[name]
    places = 4 if name == "reliability" else 2
    if spec.kind in ("int", "days") or name in ("num_gpus", "gpu_ram", "cuda_max_good"):
        # The values the seed gives these fields, drawn most of the time so that = and in
        # find offers (the rest of the time, a value between them finds none).
        discrete = {"num_gpus": [1, 2, 3, 4, 8], "gpu_ram": [24, 48, 80],
                    "cuda_max_good": [11.8, 12.2, 12.4], "direct_port_count": [10, 100, 1000],
                    "compute_cap": [800, 860, 890, 900], "cpu_cores": [4, 8, 16, 32, 64, 128]}  # fmt: skip
        if name in discrete and rng.random() < 0.8:
            return rng.choice(discrete[name])
        return _number(rng, "int" if spec.kind != "float" else "float", low, high, places)
    return _number(rng, "float", low, high, places)


def text_of(name: str, spec_kind: str, item) -> str:
    """A value as the query language writes it (spaces as underscores)."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if spec_kind in ("str", "gpu"):
        return str(item).replace(" ", "_")
    return str(item)


def term(rng: random.Random, name: str, op: str, bounds: Bounds) -> tuple[str, str, object]:
    """``(name, op, value)``; a list for ``in``/``notin``, None for ``name=any``."""
    if op in LISTS:
        items = [value(rng, name, bounds) for _ in range(rng.randint(1, 4))]
        return name, op, list(dict.fromkeys(items))
    return name, op, value(rng, name, bounds)


def query_text(terms: list[tuple[str, str, object]], order: list[tuple[str, bool]]) -> str:
    words = []
    for name, op, item in terms:
        kind = offer_query.FIELDS[name].kind
        if item is None:
            words.append(f"{name}=any")
        elif isinstance(item, list):
            words.append(f"{name} {op} [{','.join(text_of(name, kind, i) for i in item)}]")
        else:
            words.append(f"{name}{op}{text_of(name, kind, item)}")
    if order:
        words.append("-o " + ",".join(name + ("-" if down else "") for name, down in order))
    return " ".join(words)


def json_body(terms, order, limit: int, offset: int) -> dict:
    """The same search as a JSON filter body (``offer_query.parse_json``)."""
    body: dict = {"limit": limit, "offset": offset}
    for name, op, item in terms:
        body[name] = None if item is None else {JSON_OPERATORS[op]: item}
    if order:
        body["order"] = [[name, "desc" if down else "asc"] for name, down in order]
    return body


def generate(seed: int, count: int, bounds: Bounds) -> list[Search]:
    """``count`` searches, the same for the same seed and bounds."""
    rng = random.Random(seed)
    names = list(offer_query.FIELDS)
    searches = []
    for n in range(count):
        lead = names[n % len(names)]
        lead_ops = operators(offer_query.FIELDS[lead].kind)
        terms = [term(rng, lead, lead_ops[(n // len(names)) % len(lead_ops)], bounds)]
        for name in rng.sample(names, rng.choice([0, 1, 1, 2, 2, 3, 4])):
            if name != lead:
                terms.append(term(rng, name, rng.choice(operators(offer_query.FIELDS[name].kind)), bounds))  # fmt: skip
        if rng.random() < 0.08:  # a field's filter dropped, the default one most often
            terms.append(("rentable" if rng.random() < 0.6 else rng.choice(names), "=", None))
        order = []
        if rng.random() < 0.75:
            order = [
                (name, rng.random() < 0.5) for name in rng.sample(names, rng.choice([1, 1, 2]))
            ]
        limit = rng.choice([1, 10, 32, 64, 64, 64, 100, MAX_PAGE])
        depth = rng.random()
        if depth < 0.6:
            offset = 0
        elif depth < 0.92:
            offset = limit * rng.randint(1, 5)
        else:
            offset = rng.randint(0, MAX_OFFSET)
        # A field named twice keeps its last term (the parser's rule): the text says so too.
        terms = list({name: (name, op, item) for name, op, item in terms}.values())
        text = query_text(terms, order)
        body = json_body(terms, order, limit, offset) if n % 5 == 4 else None
        searches.append(Search(q=text, limit=limit, offset=offset, body=body))
    return searches


def parsed(search: Search) -> offer_query.OfferQuery:
    """The search as the API parses it (raises ``QueryError`` for a search the generator
    should never make)."""
    if search.body is not None:
        return offer_query.parse_json(search.body)
    return offer_query.parse(search.q)


def coverage(searches: list[Search]) -> set[tuple[str, str]]:
    """The (field, operator) pairs of the language that none of the searches' text uses."""
    used = set()
    for search in searches:
        for name, condition in offer_query.parse(search.q).filters.items():
            if condition is not None:
                used.add((name, condition[0]))
    every = {(name, op) for name, spec in offer_query.FIELDS.items() for op in operators(spec.kind)}
    return every - used
