"""Offer search answered in memory: each web process holds the searched columns of every
offer as numpy arrays and answers a search's filters and order there, then reads the page's
offers from PostgreSQL by id (what a renter sees is the row as it is now).

Why: no set of PostgreSQL indexes serves every field × operator × sort × page of the query
language at a million offers; a filter on an unindexed column, or a sort or deep page the
indexes do not match, reads most of the table (hundreds of milliseconds). Here every filter is
a vectorised comparison over one array, and a sort walks that field's order (``perm``, a
permutation kept per field) only as far as the page needs, so a deep page never sorts the
million.

Semantics are ``offer_query.apply``'s, term for term (defaults, GPU families, ``duration``,
``field=any``, nulls as the ORM's SQL treats them, strings in the database's collation
order); tests/marketplace/test_offer_index.py holds the two to each other on generated
searches. A search the index cannot answer exactly (a word outside ASCII, whose case folding
PostgreSQL's and Python's may differ on) is answered by SQL.

Freshness: triggers on the offers table record each changed machine with the writing
transaction's id (migration 0026). Before each search the index asks which machines changed
in transactions it has not yet seen as finished (one indexed query), and re-reads those
machines' offers, replacing their rows. So a search answers from every offer change committed
before it began, as SQL would. A TRUNCATE (the tests' flush) drops the epoch, and the index
loads afresh.

What it holds of each offer, and how that is read from PostgreSQL: ``marketplace.offer_columns``.

It serves only outside a transaction (``in_atomic_block``): inside one, the caller may have
written offers that only its own connection sees (a test's rolled-back rows, a view's own
writes), and the index, which reads committed data, must not answer for them.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.db import prepared_cursor
from marketplace import offer_columns, offer_query
from marketplace.offer_arrays import any_of, compare, first_place, walk
from marketplace.offer_columns import DERIVED, EPOCH, HELD, NULL, NULLABLE, WORDS, as_read

LOAD_CHUNK = 200_000  # ids per COPY while loading: bounds the memory a load takes at once
DIRECT = 4096  # at most this many matches are sorted outright rather than walked in order
# A search's matches are kept as row numbers once they are at most this fraction of the rows
# (1/ROWS_AT), and read from a field's order when its term takes at most 1/FEWEST_AT. Below
# that, checking a term on the rows costs less than comparing the whole column: reading a
# column at scattered rows costs ~5 ns a row, comparing all of it ~0.1 ns a row; at 1/16 each
# gather cost 0.3 ms where a whole-column term cost 0.1 ms (measured at a million offers).
ROWS_AT, FEWEST_AT = 64, 32
MERGE_AT = 2048  # rows appended since a field's order was made, before they are merged in
COMPACT_AT = 10_000  # dead rows (replaced or gone) kept before they are dropped, at least

# The epoch, the oldest transaction still running (all below it are finished), and the
# machines changed by transactions from ``{since}`` on, with their transaction ids.
CHECK = """
SELECT (SELECT token::text FROM marketplace_offer_index_epoch WHERE id = 1),
       pg_snapshot_xmin(pg_current_snapshot())::text,
       COALESCE(changed.machines, '{{}}'), COALESCE(changed.xids, '{{}}')
FROM (SELECT array_agg(machine_id) AS machines, array_agg(xid::text) AS xids
      FROM marketplace_offer_change WHERE xid >= {since}) AS changed
"""
SINCE_LAST = CHECK.format(since="%s::text::xid8")
SINCE_SNAPSHOT = CHECK.format(since="pg_snapshot_xmin(pg_current_snapshot())")


class Declined(Exception):
    """The index cannot answer this search exactly: SQL answers it."""


def serves() -> bool:
    """Whether a search here may be answered by the index (see the module's docstring)."""
    return (
        getattr(settings, "OFFER_INDEX", False)
        and connection.vendor == "postgresql"
        and not connection.in_atomic_block
    )


def page_ids(query: offer_query.OfferQuery, limit: int, offset: int) -> list[int] | None:
    """The ids of the search's page, in its order; None where the index does not serve."""
    if not serves():
        return None
    try:
        return INDEX.search(query, limit, offset)
    except Declined:
        return None


def page_columns(
    query: offer_query.OfferQuery, limit: int, offset: int, columns: tuple[str, ...]
) -> dict[str, list] | None:
    """The search's page as a list of values per column of ``columns`` (as the ORM's
    ``values()`` gives them), in its order, read from the index as of the search; None where
    the index does not serve or does not hold every column."""
    if not serves() or not INDEX.holds(columns):
        return None
    try:
        return INDEX.search_columns(query, limit, offset, columns)
    except Declined:
        return None


def page_rows(
    query: offer_query.OfferQuery, limit: int, offset: int, columns: tuple[str, ...]
) -> list[dict] | None:
    """``page_columns`` as rows (a dict of ``columns`` per offer)."""
    found = page_columns(query, limit, offset, columns)
    if found is None:
        return None
    return [dict(zip(columns, row, strict=True)) for row in zip(*found.values(), strict=True)]


class OfferIndex:
    def __init__(self):
        self.lock = threading.Lock()
        self.token: str | None = None
        self.last: str | None = None  # the xmin of the last look (``_advance``)
        self.applied: dict[int, str] = {}
        self.words: dict[str, list[str]] = {name: [] for name in WORDS}
        self.cards: dict[int, list] = {}  # by offer id, the offers whose cards are not []

    # --- loading and keeping current -------------------------------------------------------

    def current(self) -> None:
        """Make the index answer from every offer change committed before now."""
        with prepared_cursor() as cursor:  # before every search: planned once, not each time
            cursor.execute(SINCE_LAST, [self.last or "0"])
            token, xmin, machines, xids = cursor.fetchone()
        if token is None:
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO marketplace_offer_index_epoch VALUES (1, gen_random_uuid()) "
                    "ON CONFLICT DO NOTHING"
                )
        if token is None or token != self.token:
            self._load()
            return
        if any(self.applied.get(m) != x for m, x in zip(machines, xids, strict=True)):
            self._refresh()
        else:
            self._advance(xmin, machines, xids)

    def _advance(self, xmin: str, machines: list[int], xids: list[str]) -> None:
        """Remember what is applied: changes below ``xmin`` are finished and will not be
        listed again; those at or above it may be, and are skipped while unchanged."""
        self.last = xmin
        self.applied = dict(zip(machines, xids, strict=True))

    def _load(self) -> None:
        """Every offer, read in one snapshot, with what changed as of it."""
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute(SINCE_SNAPSHOT)
            token, xmin, machines, xids = cursor.fetchone()
            cursor.execute("SELECT min(id), max(id) FROM marketplace_offer")
            low, high = cursor.fetchone()
            self.words = {name: [] for name in WORDS}
            offer_columns.learn_words(cursor, self.words, "TRUE")
            parts = []
            if low is not None:
                for start in range(low, high + 1, LOAD_CHUNK):
                    where = f"o.id >= {int(start)} AND o.id < {int(start + LOAD_CHUNK)}"
                    parts.append(offer_columns.read(cursor, self.words, where))
            cards = offer_columns.read_cards(cursor, "TRUE")
        columns = {name: np.concatenate([p[name] for p in parts]) if parts else np.empty(0, dtype)
                   for name, dtype in offer_columns.dtypes().items()}  # fmt: skip
        self.n = len(columns["id"])
        columns = {name: _narrowed(name, column) for name, column in columns.items()}
        columns.update({name: np.empty(self.n, dtype=np.float64) for name in DERIVED})
        self.token = token
        self.columns = columns
        self.cards = cards
        self._derive(slice(0, self.n))
        self.live = np.ones(self.n, dtype=bool)
        self.dead = 0
        self._index_machines()
        self.perms = {}
        for name in offer_query.FIELDS:
            self._perm(name)
        self._advance(xmin, machines, xids)

    def _refresh(self) -> None:
        """Re-read the offers of the machines changed since the last look, in one snapshot
        with the list of changes."""
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute(SINCE_LAST, [self.last])
            token, xmin, machines, xids = cursor.fetchone()
            if token != self.token:
                changed = None
            else:
                changed = sorted(
                    m for m, x in zip(machines, xids, strict=True) if self.applied.get(m) != x
                )
                fresh, cards = None, {}
                if changed:
                    listed = ", ".join(str(int(m)) for m in changed)
                    where = f"o.machine_id IN ({listed})"
                    self._recode(offer_columns.learn_words(cursor, self.words, where))
                    fresh = offer_columns.read(cursor, self.words, where)
                    cards = offer_columns.read_cards(cursor, where)
        if changed is None:
            self._load()
            return
        if changed:
            self._replace(np.array(changed, dtype=np.int64), fresh, cards)
        self._advance(xmin, machines, xids)

    def _recode(self, before: dict[str, list[str]]) -> None:
        """Rewrite the loaded rows' word codes after new words joined (``before``: the lists
        as they were). Their order is kept, so every field's order stays valid."""
        for name, words in before.items():
            position = {word: code for code, word in enumerate(self.words[name])}
            mapping = np.array([position[word] for word in words] or [0], dtype=np.int32)
            column = self.columns[name]
            column[: self.n] = mapping[column[: self.n]]

    def _index_machines(self) -> None:
        """Where each machine's rows are: the loaded rows sorted by machine, and the rows of
        machines re-read since (``moved``)."""
        machine = self.columns["machine_id"][: self.n]
        self.by_machine = np.argsort(machine, kind="stable")
        self.machine_sorted = machine[self.by_machine]
        self.moved: dict[int, np.ndarray] = {}

    def _rows_of(self, machine: int) -> np.ndarray:
        if machine in self.moved:
            return self.moved[machine]
        low = np.searchsorted(self.machine_sorted, machine, side="left")
        high = np.searchsorted(self.machine_sorted, machine, side="right")
        return self.by_machine[low:high]

    def _replace(
        self, machines: np.ndarray, fresh: dict[str, np.ndarray], cards: dict[int, list]
    ) -> None:
        """The machines' rows as ``fresh`` has them (and ``cards``): the old ones dropped, the
        new appended."""
        for machine in machines.tolist():
            rows = self._rows_of(machine)
            self.dead += int(np.count_nonzero(self.live[rows]))
            self.live[rows] = False
            for pk in self.columns["id"][rows].tolist():
                self.cards.pop(pk, None)
        self.cards.update(cards)
        count = len(fresh["id"])
        self._reserve(self.n + count)
        start = self.n
        for name, values in fresh.items():
            column = self.columns[name]
            if column.dtype == np.int32 and values.dtype == np.int64 and not _fits(values):
                # A value past 32 bits: the column widens (assigning would wrap it silently).
                self.columns[name] = column = column.astype(np.int64)
            column[start : start + count] = values
        self._derive(slice(start, start + count))
        self.live[start : start + count] = True
        self.n += count
        order = np.argsort(fresh["machine_id"], kind="stable")
        grouped = fresh["machine_id"][order]
        for machine in machines.tolist():
            low = np.searchsorted(grouped, machine, side="left")
            high = np.searchsorted(grouped, machine, side="right")
            self.moved[machine] = order[low:high] + start
        if self.dead > max(self.n // 4, COMPACT_AT):
            self._compact()

    def _reserve(self, size: int) -> None:
        capacity = len(self.live)
        if size <= capacity:
            return
        capacity = max(size, capacity + capacity // 2, 1024)
        for name, column in self.columns.items():
            grown = np.zeros(capacity, dtype=column.dtype)
            grown[: self.n] = column[: self.n]
            self.columns[name] = grown
        live = np.zeros(capacity, dtype=bool)
        live[: self.n] = self.live[: self.n]
        self.live = live

    def _compact(self) -> None:
        """Drop the dead rows; each field's order is kept, renumbered."""
        keep = np.flatnonzero(self.live[: self.n])
        renumber = np.full(self.n, -1, dtype=np.int64)
        renumber[keep] = np.arange(len(keep))
        for name in self.columns:
            self.columns[name] = self.columns[name][keep].copy()
        for name, (perm, covered) in self.perms.items():
            moved = renumber[perm]
            self.perms[name] = (
                moved[moved >= 0].astype(perm.dtype),
                int(renumber[:covered].max(initial=-1)) + 1,
            )
        self.n = len(keep)
        self.live = np.ones(self.n, dtype=bool)
        self.dead = 0
        self._index_machines()

    def _derive(self, rows: slice) -> None:
        units = self.columns["num_gpus"][rows]
        for name, per_unit in DERIVED.items():
            self.columns[name][rows] = self.columns[per_unit][rows] * units

    # --- answering -------------------------------------------------------------------------

    def search(self, query: offer_query.OfferQuery, limit: int, offset: int) -> list[int]:
        with self.lock:
            rows = self._page(query, limit, offset)  # loads the index on a first search
            return self.columns["id"][rows].tolist()

    def search_columns(
        self, query: offer_query.OfferQuery, limit: int, offset: int, columns: tuple[str, ...]
    ) -> dict[str, list]:
        with self.lock:
            return self._values(self._page(query, limit, offset), columns)

    def holds(self, columns: tuple[str, ...]) -> bool:
        """Whether the index holds every one of ``columns`` (``_values``)."""
        return all(name in HELD for name in columns)

    def _page(self, query: offer_query.OfferQuery, limit: int, offset: int) -> np.ndarray:
        """The rows of the search's page, in its order, as of every change committed before
        now (under the lock)."""
        self.current()
        found = self._matching(query)
        order = [*(query.order or offer_query.DEFAULT_ORDER), ("id", False)]
        if found.dtype == bool:
            return self._top(found, order, offset + limit)[offset : offset + limit]
        return self._top_of(found, order, offset + limit)[offset : offset + limit]

    def _values(self, rows: np.ndarray, columns: tuple[str, ...]) -> dict[str, list]:
        """The rows' values of each column, as the database gives them: words as text, nulls
        as None, end dates as datetimes, cards as their lists."""
        values = {}
        for name in columns:
            if name == "cards":
                pks = self.columns["id"][rows].tolist()
                values[name] = [list(self.cards.get(pk, ())) for pk in pks]
            else:
                values[name] = as_read(name, self.columns[name][rows].tolist(), self.words)
        return values

    def _matching(self, query: offer_query.OfferQuery) -> np.ndarray:
        """The rows the search's filters (defaults included) match: a mask over every row, or
        where few match, their row numbers (in no order). The term that leaves fewest rows by
        its field's order is read from that order; once the terms so far leave few rows, the
        rest are checked on those rows only. Few rows stay row numbers: a mask made of them
        would be turned back into row numbers to sort them (a scan of every row, some 0.4 ms
        at a million, the dearest step of a selective search)."""
        now = timezone.now()
        terms = sorted(query.effective_filters().items(), key=_narrowing)
        found = {name: self._stretches(name, op, value, now) for name, (op, value) in terms}
        # Where a field's order tells how many rows a term takes (exactly, by two binary
        # searches), the terms that take fewest go first, so the rows left become few, and
        # cheap to check, after fewer whole-column comparisons; the rest follow as before.
        terms.sort(key=lambda term: _taken(found[term[0]]))
        rows, read = self._fewest(terms, found, now)  # rows: every row, while None
        if rows is None:
            mask = self.live[: self.n].copy()
        else:
            rows = rows[self.live[rows]]
        for name, (op, value) in terms:
            if name == read:  # its rows are these already
                continue
            if rows is None:
                mask &= self._term(name, op, value, now, self._column(name))
                if np.count_nonzero(mask) <= self.n // ROWS_AT:
                    rows = np.flatnonzero(mask)
            else:
                rows = rows[self._term(name, op, value, now, self._column(name)[rows])]
        return mask if rows is None else rows

    def _fewest(
        self, terms: list, stretches: dict, now: datetime
    ) -> tuple[np.ndarray | None, str | None]:
        """The rows (live or not) taken by the term that takes fewest, and its field, where it
        takes few (at most 1/FEWEST_AT): read from its field's order by binary searches
        instead of compared over every row, which a selective search would otherwise pay per
        term. ``stretches``: each term's ``_stretches``. (None, None) where every term takes
        many."""
        best = None
        for name, (op, value) in terms:
            found = stretches[name]
            if found is not None and (best is None or found[0] < best[0][0]):
                best = (found, name, op, value)
        if best is None or best[0][0] > self.n // FEWEST_AT:
            return None, None
        (_, perm, covered, stretches), name, op, value = best
        added = np.arange(covered, self.n)
        added = added[self._term(name, op, value, now, self._column(name)[covered:])]
        return np.concatenate([*(perm[low:high] for low, high in stretches), added]), name

    def _stretches(
        self, name: str, op: str, value, now: datetime
    ) -> tuple[int, np.ndarray, int, list[tuple[int, int]]] | None:
        """Where a range or equality term's rows lie in its field's order: (how many, the
        order, how many rows it covers, the places), or None for a term an order does not
        answer by stretches (``!=``, ``notin``, true/false)."""
        spec = offer_query.FIELDS[name]
        if spec.kind == "bool" or op in ("!=", "notin"):
            return None
        key = self._key(name)
        perm, covered = self._perm(name)
        if op in ("<", "<=", ">", ">="):
            if spec.kind == "days":
                value = _micros(now + timedelta(days=value))
            low, high = 0, len(perm)
            if op in ("<", "<="):
                high = first_place(key, perm, value, after=op == "<=")
            else:
                low = first_place(key, perm, value, after=op == ">")
            if spec.column in NULLABLE and not (spec.kind == "days" and op in (">", ">=")):
                high = min(high, first_place(key, perm, NULL, after=False))  # nulls sort last
            stretches = [(low, high)] if low < high else []
        else:
            values = value if isinstance(value, list) else [value]
            if spec.kind in ("str", "gpu"):
                values = self._codes(name, spec.kind, values).tolist()
            edges = sorted({(first_place(key, perm, v, after=False), first_place(key, perm, v, after=True))
                            for v in values})  # fmt: skip
            stretches = [(low, high) for low, high in edges if low < high]
        return sum(high - low for low, high in stretches), perm, covered, stretches

    def _column(self, name: str) -> np.ndarray:
        spec = offer_query.FIELDS[name]
        column = name if name in DERIVED else spec.column
        return self.columns[column][: self.n]

    def _term(self, name: str, op: str, value, now: datetime, column: np.ndarray) -> np.ndarray:
        """Which of ``column``'s values (the field's, of all rows or some) the term takes."""
        spec = offer_query.FIELDS[name]
        if spec.kind == "days":  # no end date: forever
            moment = _micros(now + timedelta(days=value))
            if op in (">", ">="):
                return (column == NULL) | compare(column, op, moment)
            return (column != NULL) & compare(column, op, moment)
        values = value if isinstance(value, list) else [value]
        if spec.kind in ("str", "gpu"):
            equal = any_of(column, self._codes(name, spec.kind, values))
        elif op in ("in", "notin", "=", "==", "!="):
            equal = np.zeros(len(column), dtype=bool)
            for item in values:
                equal |= column == item
        else:  # a range; a null (min_bid) is in none, as in SQL
            found = compare(column, op, value)
            return found & (column != NULL) if spec.column in NULLABLE else found
        # ``!=`` and ``notin`` take nulls, as the ORM's negation does (NOT (x = v AND x IS
        # NOT NULL)).
        return ~equal if op in ("!=", "notin") else equal

    def _codes(self, name: str, kind: str, values: list[str]) -> np.ndarray:
        """The codes of the words a word filter matches: case aside (``iexact``), or for a GPU
        its model or family (``offer_query._gpu_family``)."""
        words = self.words[offer_query.FIELDS[name].column]
        if not all(value.isascii() for value in values) or not all(w.isascii() for w in words):
            raise Declined  # upper-casing outside ASCII may differ from PostgreSQL's
        if kind == "gpu":
            wanted = [value.strip().upper() for value in values]
            match = [
                any(w.upper() == x or w.upper().startswith((f"{x}-", f"{x} ")) for x in wanted)
                for w in words
            ]
        else:
            wanted = {value.upper() for value in values}
            match = [w.upper() in wanted for w in words]
        return np.flatnonzero(np.array(match, dtype=bool))

    def _key(self, name: str) -> np.ndarray:
        """The field's values as they sort (words by code, which is collation order)."""
        column = self._column(name)
        return column.view(np.int8) if column.dtype == bool else column

    def _perm(self, name: str) -> tuple[np.ndarray, int]:
        """The rows in the field's ascending order (ties in any order), and how many rows it
        covers: rows appended since are merged in once there are ``MERGE_AT`` of them."""
        key = self._key(name)
        perm, covered = self.perms.get(name, (None, 0))
        if perm is None:
            perm = np.argsort(key, kind="stable").astype(np.int32)
            covered = self.n
        elif self.n - covered >= MERGE_AT:
            added = np.arange(covered, self.n)
            added = added[np.argsort(key[added], kind="stable")]
            at = np.searchsorted(key[perm], key[added], side="right")
            perm = np.insert(perm, at, added.astype(np.int32))
            covered = self.n
        self.perms[name] = (perm, covered)
        return perm, covered

    def _top(self, mask: np.ndarray, order: list[tuple[str, bool]], k: int) -> np.ndarray:
        """The first ``k`` rows of ``mask`` in ``order`` (which ends with the unique id).

        Few matches are sorted outright. Otherwise the first field's order is walked until
        ``k`` matches are found; the rows tied with the ``k``-th on that field are ranked by
        the rest of the order the same way; rows appended since that order was made join
        the final sort."""
        count = int(np.count_nonzero(mask))
        if count == 0 or k <= 0:
            return np.empty(0, dtype=np.int64)
        if not order:  # ties on the unique id: one row at most
            return np.flatnonzero(mask)[:k]
        if count <= max(DIRECT, 2 * k):
            return self._first_of(np.flatnonzero(mask), order, k)
        name, descending = order[0]
        key = self._key(name)
        perm, covered = self._perm(name)
        # Where the matches lie far along the order, sorting them outright costs less than
        # walking there: the walk stops at a few times the number of matches.
        found = walk(perm[::-1] if descending else perm, mask, k, len(perm) * k // count,
                      limit=max(4 * count, 65_536))  # fmt: skip
        if found is None:
            return self._first_of(np.flatnonzero(mask), order, k)
        if len(found) >= k:
            edge = key[found[k - 1]]
            head = found[:k]
            before = head[key[head] != edge]
            # The rows tied on this field are one stretch of its order; a long one (a flag,
            # a field of few values) is found by comparing every row, which costs less than
            # gathering it from the order and scattering it back into a mask.
            low, high = (
                first_place(key, perm, edge, after=False),
                first_place(key, perm, edge, after=True),
            )
            if high - low > self.n // 16:
                tied_mask = mask & (key == edge)
                tied_mask[covered:] = False  # those join below, with the rest appended
                rest = self._top(tied_mask, order[1:], k - len(before))
            else:
                tied = perm[low:high]
                rest = self._top_of(tied[mask[tied]].astype(np.int64), order[1:], k - len(before))
            found = np.concatenate([before, rest])
        added = np.flatnonzero(mask[covered:]) + covered
        return self._sorted(np.concatenate([found, added]), order)[:k]

    def _top_of(self, rows: np.ndarray, order: list[tuple[str, bool]], k: int) -> np.ndarray:
        """``_top`` of these rows."""
        if not order or len(rows) <= max(DIRECT, 2 * k):
            return self._first_of(rows, order, k)
        mask = np.zeros(self.n, dtype=bool)
        mask[rows] = True
        return self._top(mask, order, k)

    def _first_of(self, rows: np.ndarray, order: list[tuple[str, bool]], k: int) -> np.ndarray:
        """The first ``k`` of ``rows`` in ``order``: only the rows up to the ``k``-th value of
        the first field (found by a partial sort, linear) are sorted."""
        if order and len(rows) > 4 * k:
            name, descending = order[0]
            key = self._key(name)[rows]
            key = (
                -key.astype(np.float64 if key.dtype.kind == "f" else np.int64)
                if descending
                else key
            )
            rows = rows[key <= np.partition(key, k - 1)[k - 1]]
        return self._sorted(rows, order)[:k]

    def _sorted(self, rows: np.ndarray, order: list[tuple[str, bool]]) -> np.ndarray:
        if not order:  # past the unique id: one row at most
            return rows
        keys = []
        for name, descending in reversed(order):
            key = self._key(name)[rows]
            keys.append(-key.astype(np.float64 if key.dtype.kind == "f" else np.int64)
                        if descending else key)  # fmt: skip
        return rows[np.lexsort(keys)] if len(rows) else rows


def _narrowed(name: str, column: np.ndarray) -> np.ndarray:
    """A whole-number column as 32-bit integers where its values fit, as a field of GPUs,
    cores, ports or micro-dollars does: a filter compares every row of it, and reading half
    the bytes made such a comparison about five times as fast at a million offers. A value
    that comes later and does not fit widens the column again (``_replace``); comparing with
    any number, however large, is exact either way. Columns with a null marker keep 64 bits."""
    if column.dtype != np.int64 or name in NULLABLE or not _fits(column):
        return column
    return column.astype(np.int32)


def _fits(values: np.ndarray) -> bool:
    bounds = np.iinfo(np.int32)
    return len(values) == 0 or (values.min() >= bounds.min and values.max() <= bounds.max)


def _taken(stretches) -> tuple[bool, int]:
    """A term's place by the rows its ``_stretches`` say it takes: counted terms first, fewest
    first; terms an order does not count after them (a stable sort keeps their order)."""
    return (True, 0) if stretches is None else (False, stretches[0])


def _narrowing(term) -> int:
    """Terms that usually leave fewest rows first: equalities, then ranges, then the rest
    (``!=``, ``notin``, true/false)."""
    name, (op, _) = term
    if offer_query.FIELDS[name].kind == "bool":
        return 3
    if op in ("=", "==", "in"):
        return 0
    return 1 if op in ("<", "<=", ">", ">=") else 2


def _micros(moment: datetime) -> int:
    delta = moment - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


INDEX = OfferIndex()
