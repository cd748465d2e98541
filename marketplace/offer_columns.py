"""What the offer index (``marketplace.offer_index``) holds of each offer, and how it is read
from PostgreSQL: the columns and their types in memory, one binary COPY decoded into numpy
arrays, words (GPU names, regions, drivers) as codes in the database's collation order, and the
few offers' cards. And back: ``as_read`` gives a held column's values as the ORM reads them.

Why a module of its own: this is the index's one conversation with the database's formats
(COPY's binary layout, collation, NULL, JSON); the index's searching works on the arrays
alone.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np

NULL = np.iinfo(np.int64).max  # a null end date or minimum bid: after every value, as SQL sorts
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WORDS = ("gpu_name", "geolocation", "driver_version")  # held as codes in collation order
# The loaded columns and how each is read: numbers and flags as they are; nullable ones with
# NULL for null; words as their code (``OfferIndex._load``).
NUMBERS = {
    "id": "int8", "machine_id": "int8", "provider_team_id": "int8", "num_gpus": "int8",
    "gpu_ram": "float8", "cpu_cores_per_unit": "float8", "cpu_ram_per_unit": "float8",
    "disk_per_unit": "float8", "disk_enforced": "bool", "price_per_gpu_hour": "int8",
    "dph_total": "int8", "storage_cost": "int8", "reliability": "float8",
    "cuda_max_good": "float8", "verified": "bool", "rentable": "bool", "rented": "bool",
    "score": "float8", "cpu_cores": "int8", "datacenter": "bool", "static_ip": "bool",
    "direct_port_count": "int8", "sharing": "bool", "gpu_frac": "float8",
    "slice_core_percent": "int8", "slice_memory_mb": "int8", "total_flops": "float8",
    "compute_cap": "int8", "gpu_mem_bw": "float8", "dlperf": "float8",
    "dlperf_per_dphtotal": "float8", "inet_up": "float8", "inet_down": "float8",
    "disk_bw": "float8",
    # Not searched; held so a page's offers are read from here (``offer_index.page_rows``).
    "total_gpus": "int8", "min_gpus": "int8", "min_slice_core_percent": "int8",
    "bench_simulated": "bool",
}  # fmt: skip
NULLABLE = {
    "min_bid": f"COALESCE(min_bid, {NULL})",
    "end_date": f"COALESCE((EXTRACT(EPOCH FROM end_date) * 1000000)::int8, {NULL})",
}
# ``offer_query.ANNOTATIONS``, computed the same way (float8 × the GPUs).
DERIVED = {
    "gpu_total_ram": "gpu_ram", "cpu_cores_effective": "cpu_cores_per_unit",
    "cpu_ram": "cpu_ram_per_unit", "disk_space": "disk_per_unit",
}  # fmt: skip
NUMPY = {"int8": ">i8", "float8": ">f8", "bool": "?"}


HELD = {*NUMBERS, *NULLABLE, *WORDS, "cards"}


def as_read(name: str, values: list, words: dict[str, list[str]]) -> list:
    """A held column's values (``tolist()`` of its array) as the database gives them: words as
    text, nulls as None, end dates as datetimes."""
    if name in WORDS:
        return [words[name][code] for code in values]
    if name == "end_date":
        return [None if v == NULL else EPOCH + timedelta(microseconds=v) for v in values]
    if name in NULLABLE:
        return [None if v == NULL else v for v in values]
    return values


def dtypes() -> dict[str, np.dtype]:
    """Each held column's type in memory (native byte order; codes for words)."""
    types = {name: np.dtype(NUMPY[kind]).newbyteorder("=") for name, kind in NUMBERS.items()}
    types.update({name: np.dtype(np.int64) for name in NULLABLE})
    types.update({name: np.dtype(np.int32) for name in WORDS})
    return types


def learn_words(cursor, words: dict[str, list[str]], where: str) -> dict[str, list[str]]:
    """Add to ``words`` (a list per word column, in collation order) the words of the offers
    ``where`` selects that it has no code for; returns the lists they changed as they were
    (the held codes then change: ``OfferIndex._recode``)."""
    before = {}
    for name in WORDS:
        cursor.execute(f"SELECT DISTINCT o.{name} FROM marketplace_offer o WHERE {where}")  # noqa: S608
        known = set(words[name])
        found = [row[0] for row in cursor.fetchall() if row[0] not in known]
        if found:
            # Codes in the database's collation order, so a sort by a word sorts codes.
            cursor.execute(
                "SELECT w FROM unnest(%s::text[]) AS w ORDER BY w",
                [words[name] + found],
            )
            before[name] = words[name]
            words[name] = [row[0] for row in cursor.fetchall()]
    return before


def read(cursor, words: dict[str, list[str]], where: str) -> dict[str, np.ndarray]:
    """The held columns of the offers ``where`` selects (a condition on ``o``), words coded by
    ``words``, by one binary COPY: every column fixed-width and not null, so the rows are one
    numpy record array."""
    sources = [(name, f"o.{name}::{kind}", kind) for name, kind in NUMBERS.items()]
    sources += [(name, sql.replace("min_bid", "o.min_bid").replace("end_date", "o.end_date"),
                 "int8") for name, sql in NULLABLE.items()]  # fmt: skip
    joins = []
    for number, name in enumerate(WORDS):
        listed = ", ".join(_literal(word) for word in words[name]) or "NULL"
        joins.append(
            f"LEFT JOIN unnest(ARRAY[{listed}]::text[]) WITH ORDINALITY AS w{number}(word, code)"
            f" ON w{number}.word = o.{name}"
        )
        sources.append((name, f"COALESCE(w{number}.code - 1, -1)::int8", "int8"))
    select = ", ".join(sql for _, sql, _ in sources)
    statement = (
        f"COPY (SELECT {select} FROM marketplace_offer o {' '.join(joins)} WHERE {where}) "  # noqa: S608
        "TO STDOUT (FORMAT BINARY)"
    )
    with cursor.cursor.copy(statement) as copy:
        data = b"".join(bytes(block) for block in copy)
    fields = [("count", ">i2")]
    for number, (name, _, kind) in enumerate(sources):
        fields += [(f"length{number}", ">i4"), (name, NUMPY[kind])]
    record = np.dtype(fields)
    header = 19 + int.from_bytes(data[15:19], "big") if data else 0
    body = data[header:-2] if data else b""
    rows = np.frombuffer(body, dtype=record)
    types = dtypes()
    found = {name: rows[name].astype(types[name]) for name, _, _ in sources}
    if len(rows) and any((found[name] < 0).any() for name in WORDS):
        raise RuntimeError("an offer's word has no code")  # learn_words missed one
    return found


def read_cards(cursor, where: str) -> dict[int, list]:
    """The cards (a shared machine's cards and their free shares) of the offers ``where``
    selects, by offer id, for the few whose list is not empty."""
    cursor.execute(
        f"SELECT o.id, o.cards::text FROM marketplace_offer o WHERE ({where}) "  # noqa: S608
        "AND o.cards <> '[]'::jsonb"
    )
    return {pk: json.loads(text) for pk, text in cursor.fetchall()}


def _literal(word: str) -> str:
    """A word as an SQL string literal (standard_conforming_strings: quotes doubled)."""
    if "\x00" in word:
        raise ValueError("a word with a NUL")
    return "'" + word.replace("'", "''") + "'"
