"""Offer search over 1,000,000 offers: generated searches over HTTP, beside their raw SQL.

An offer is a GPU-count bundle of a machine (1, 2, 4, 8 and its free count, issue 32), so a
million offers are some 300,000 machines; the bench prints how many.

Budget (DESIGN.md): over the generated searches, p50 ≤ 5 ms, p99 ≤ 15 ms server-side, and our
part of a search (the answer less the search's own work) ≤ 2× the search's own work.
Server-side is what each web process says it took (its ``Server-Timing: app;dur=`` header,
core/server_timing.py: from uvicorn handing it the request to the answer's head going out);
the client's own time, which adds the HTTP round trip and this process's parsing, is printed
beside it. The search's own work is the ``search;dur=`` the offer view adds to the same header
(marketplace/api/offers.py): finding the page (in the offer index, or by SQL when it is off)
and reading the page's rows. The searches go as a user's do: over
HTTP, on keep-alive connections, to two web processes started from the production recipe's
unit (deploy/, uvicorn, its environment file's log level), each with one of ``--keys`` read
API keys in turn (the production throttles stay on). Three lines are timed:

- *generated*: ``--queries`` searches drawn by a seeded random generator over every field
  and operator of the query language, with varied values, sorts and pages (a fifth as JSON
  filter bodies): bench/offer_queries.py. The budget's workload (DESIGN.md), judged on all
  three.
- *fixed*: the bench's earlier fixed searches (``QUERIES``), ``--fixed-rounds`` times over,
  kept to compare with earlier rounds: printed with their ratios, not judged. The project
  guide rules out "a fixed handful of queries" as the workload a budget is met on, and
  DESIGN.md names the generated searches.
- *stack*: a search that reads nothing (``id=0``, a page of one), timed the same way: the
  floor of any search on this stack (authentication, throttle, the index's freshness check,
  Django and HTTP), printed beside the fixed line, not judged.

The our-part ratio is the median over searches of (answer − search) / search, both
server-side. Until 2026-12-07 it was taken against each search's own SQL run raw, which stopped
meaning anything once the web processes answered from their in-memory offer index: the raw
SQL of a generated search (p50 120–190 ms) is slower than the whole answer, the ratio came
out negative and could not fail.

Beside each search its SQL (the statement the ORM writes for it, page included) still runs
raw on a psycopg connection (after it, or before it for every other search): what the same
search costs without the index, printed, not judged, and a page of another length than its
SQL's fails the bench. The slowest generated searches are printed with their SQL time.

The web processes answer from their in-memory offer index (marketplace/offer_index.py, the
``OFFER_INDEX`` setting, on by default), loaded at each one's first search (the warm-up).
``BENCH_WEB_ENV=OFFER_INDEX=0`` times the SQL path instead.

The data lives in a scratch database (``gpumkt_bench_offers`` + ``BENCH_DATABASE_SUFFIX``)
with a private Redis, dropped at the end.

    .venv/bin/python bench/offer_search.py [--offers 1000000] [--queries 400] [--seed 34]
        [--fixed-rounds 20] [--keys 100] [--reuse]

``--reuse`` keeps the seeded database at the end and measures an existing one again instead
of seeding (1–2.5 minutes for a million); fresh API keys are made for each run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import (  # noqa: E402
    budget_row,
    private_redis,
    scratch_database,
    web_bench_environment,
    web_processes,
)

REDIS = web_bench_environment("offers")
os.environ.setdefault("LOG_LEVEL", "WARNING")  # this process's own log; the web's is the recipe's

QUERIES = [
    "",
    "num_gpus>=2 gpu_name=RTX_4090 reliability>0.98 dph_total<1.5 geolocation in [US,CA]",
    "gpu_name=A100-SXM4-80GB num_gpus>=4 -o dph_total",
    "reliability>0.99 -o dph_total",
    "gpu_ram>=40 geolocation=EU -o score-",
    "num_gpus>=8 -o dph_total-",
    "dph_total<0.5 cuda_max_good>=12",
    "geolocation notin [US] verified=true -o reliability-",
    "num_gpus=1 reliability>0.9 -o dph_total",
    "num_gpus=1 dph_total<=0.45 -o dph_total",
    "cpu_cores>=16 static_ip=true datacenter=false direct_port_count>=100 -o score-",
]
# name, GB per GPU, dollars per GPU-hour, FP32 TFLOPS, compute capability × 100, GB/s, dlperf
GPUS = [("RTX 4090", 24.0, 0.45, 82.6, 890, 1008, 60), ("RTX 3090", 24.0, 0.25, 35.6, 860, 936, 30),
        ("A100-SXM4-80GB", 80.0, 1.6, 19.5, 800, 2039, 55),
        ("H100-SXM5-80GB", 80.0, 2.9, 67.0, 900, 3350, 120),
        ("L40S", 48.0, 0.9, 91.6, 890, 864, 70), ("RTX A6000", 48.0, 0.6, 38.7, 860, 768, 35)]  # fmt: skip
REGIONS = ["US", "CA", "EU", "AS", "SA", "OC"]
DRIVERS = ["535.183.01", "550.54.14", "555.42.02"]


# Issue 17 raised the budget: 1,000,000 offers (was 100,000), p50 ≤ 5 ms, p99 ≤ 15 ms;
# issue 34 added our part of a search ≤ 2× its SQL.
P50_BUDGET_MS, P99_BUDGET_MS, OURS_BUDGET = 5, 15, 2.0


def populate(count: int) -> int:
    """The provider, its machines and their ``count`` offers, written by the database itself
    (``INSERT … SELECT`` over ``generate_series``, seeded, so every run gets the same offers):
    a million rows in well under a minute, where building them in Python took 12 minutes.
    Returns how many machines the offers are on.

    One machine and its offer are made through the ORM; every other row copies their columns
    and draws the searched ones per machine (the GPU model with its memory, base price and
    benchmark figures, its GPUs and how many are free, price, reliability, region, driver,
    CUDA, verified, cores, end date, minimum bid, network and disk speeds), so a generated
    search on any field finds some offers and not others. Each machine is then offered as
    ``offers_refresh`` would: a bundle of 1, 2, 4… GPUs up to its count, and one of all its
    free GPUs (``all_free``), each rentable when its GPUs are free; the offers stop at
    ``count``.
    """
    from django.db import connection, transaction

    from hosts.models import Machine
    from marketplace.models import Offer, Team

    team = Team.objects.create(name="bench provider")
    template = Machine.objects.create(
        team=team, name="template", address="10.255.255.255", port=22, ssh_user="root",
        status="online", listed=True,
    )  # fmt: skip
    Offer.objects.create(
        machine=template, provider_team=team, rentable=False, gpu_name="template", num_gpus=0,
        total_gpus=1, gpu_ram=0, cpu_cores_per_unit=4, cpu_ram_per_unit=32, disk_per_unit=100,
        price_per_gpu_hour=0, dph_total=0, storage_cost=0, reliability=0,
    )  # fmt: skip

    def columns(model, overridden: set[str]) -> list[str]:
        names = [field.column for field in model._meta.concrete_fields]
        return [name for name in names if name not in overridden and name != "id"]

    machine_copied = columns(Machine, {"name", "address"})
    offer_drawn = [
        "machine_id", "all_free", "rentable", "rented", "gpu_name", "num_gpus", "total_gpus",
        "gpu_ram", "cpu_cores_per_unit", "cpu_ram_per_unit", "disk_per_unit",
        "price_per_gpu_hour", "dph_total", "storage_cost", "reliability", "geolocation",
        "driver_version", "cuda_max_good", "verified", "score", "cpu_cores", "static_ip",
        "direct_port_count", "disk_enforced", "end_date", "min_bid", "total_flops",
        "compute_cap", "gpu_mem_bw", "dlperf", "dlperf_per_dphtotal", "inet_up", "inet_down",
        "disk_bw",
    ]  # fmt: skip
    offer_copied = columns(Offer, set(offer_drawn))

    def column(index: int) -> str:
        return ", ".join(repr(gpu[index]) for gpu in GPUS)

    names, rams, prices, flops, caps, bandwidths, dlperfs = (column(i) for i in range(7))
    regions = ", ".join(f"'{region}'" for region in REGIONS)
    drivers = ", ".join(f"'{driver}'" for driver in DRIVERS)
    # Machines of 1, 2, 4, 8 and 8 GPUs have about 3.2 offers each on average: make enough
    # machines, and those past the ``count``-th offer go again.
    machines = count // 3 + 10
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.42)")
        cursor.execute(
            f"""
            INSERT INTO hosts_machine (name, address, {", ".join(machine_copied)})
            SELECT 'm' || i, '10.' || (i / 65536) || '.' || (i / 256 %% 256) || '.' || (i %% 256),
                   {", ".join("t." + name for name in machine_copied)}
            FROM hosts_machine t, generate_series(0, %s - 1) AS i
            WHERE t.id = %s
            """,
            [machines, template.pk],
        )
        # The draws are made once per machine in a materialized CTE; its bundles are the
        # sizes up to its GPUs and its free count, each priced and scored for its GPUs.
        cursor.execute(
            f"""
            WITH drawn AS MATERIALIZED (
                SELECT m.id, 1 + floor(random() * {len(GPUS)})::int AS g,
                       (ARRAY[1, 2, 4, 8, 8])[1 + floor(random() * 5)::int] AS total,
                       random() AS free_draw, 0.7 + random() * 0.7 AS price_factor,
                       round((0.85 + random() * 0.15)::numeric, 4)::float AS reliability,
                       (ARRAY[4, 8, 16])[1 + floor(random() * 3)::int] AS cores,
                       (ARRAY[32, 64, 90])[1 + floor(random() * 3)::int] AS ram,
                       (ARRAY[100, 250, 500])[1 + floor(random() * 3)::int] AS disk,
                       (ARRAY[50000, 100000, 150000])[1 + floor(random() * 3)::int] AS storage,
                       (ARRAY[{regions}])[1 + floor(random() * {len(REGIONS)})::int] AS region,
                       (ARRAY[11.8, 12.2, 12.4])[1 + floor(random() * 3)::int] AS cuda,
                       random() < 0.7 AS verified, random() < 0.8 AS static_ip,
                       (ARRAY[10, 100, 1000])[1 + floor(random() * 3)::int] AS ports,
                       (ARRAY[{drivers}])[1 + floor(random() * {len(DRIVERS)})::int] AS driver,
                       random() < 0.5 AS disk_enforced,
                       CASE WHEN random() < 0.5 THEN NULL
                            ELSE now() + make_interval(days => 1 + floor(random() * 365)::int)
                       END AS end_date,
                       CASE WHEN random() < 0.5 THEN NULL ELSE 0.3 + random() * 0.6 END
                           AS bid_factor,
                       round((50 + random() * 10000)::numeric, 1)::float AS inet_up,
                       round((50 + random() * 10000)::numeric, 1)::float AS inet_down,
                       round((200 + random() * 5000)::numeric, 1)::float AS disk_bw
                FROM hosts_machine m WHERE m.team_id = %s AND m.id <> %s
            ), priced AS (
                SELECT d.*, floor(d.free_draw * (d.total + 1))::int AS free,
                       (ARRAY[{names}])[d.g] AS gpu_name, (ARRAY[{rams}])[d.g] AS gpu_ram,
                       round((ARRAY[{prices}])[d.g] * d.price_factor * 1000000)::bigint AS price,
                       (ARRAY[{flops}])[d.g] AS flops, (ARRAY[{caps}])[d.g] AS cap,
                       (ARRAY[{bandwidths}])[d.g] AS bandwidth, (ARRAY[{dlperfs}])[d.g] AS dlperf
                FROM drawn d
            ), bundles AS (
                SELECT p.*, s.size
                FROM priced p,
                     LATERAL (SELECT DISTINCT size FROM unnest(
                         ARRAY(SELECT 1 << k FROM generate_series(0, 3) AS k
                               WHERE 1 << k <= p.total) || ARRAY[p.total, p.free]
                     ) AS size) AS s
                ORDER BY p.id, s.size
                LIMIT %s
            )
            INSERT INTO marketplace_offer ({", ".join(offer_drawn + offer_copied)})
            SELECT b.id, b.size = b.free, b.size >= 1 AND b.size <= b.free, b.size > b.free,
                   b.gpu_name, b.size, b.total, b.gpu_ram, b.cores, b.ram, b.disk, b.price,
                   b.price * b.size, b.storage, b.reliability, b.region, b.driver, b.cuda,
                   b.verified,
                   round((b.reliability ^ 2 * b.gpu_ram * b.size
                          / greatest(b.price * b.size / 1000000.0, 0.01))::numeric, 4)::float,
                   b.cores * b.total, b.static_ip, b.ports, b.disk_enforced, b.end_date,
                   round(b.price * b.bid_factor)::bigint, b.flops * b.size, b.cap, b.bandwidth,
                   b.dlperf * b.size,
                   round((b.dlperf * 1000000.0 / greatest(b.price, 1))::numeric, 2)::float,
                   b.inet_up, b.inet_down, b.disk_bw,
                   {", ".join("t." + name for name in offer_copied)}
            FROM bundles b, marketplace_offer t
            WHERE t.machine_id = %s
            """,
            [team.pk, template.pk, count, template.pk],
        )
        cursor.execute("DELETE FROM marketplace_offer WHERE machine_id = %s", [template.pk])
        cursor.execute(
            "DELETE FROM hosts_machine m WHERE m.team_id = %s AND NOT EXISTS "
            "(SELECT 1 FROM marketplace_offer o WHERE o.machine_id = m.id)",
            [team.pk],
        )
        cursor.execute("SELECT count(*) FROM hosts_machine WHERE team_id = %s", [team.pk])
        (offered_machines,) = cursor.fetchone()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE marketplace_offer")
        cursor.execute("VACUUM ANALYZE hosts_machine")
    return offered_machines


def reused_count(count: int) -> int:
    """How many machines hold the ``count`` offers an earlier ``--reuse`` run seeded."""
    from hosts.models import Machine
    from marketplace.models import Offer

    seeded = Offer.objects.count()
    if seeded != count:
        sys.exit(
            f"The kept database holds {seeded:,} offers, not {count:,}: run without --reuse "
            "once to seed it afresh."
        )
    return Machine.objects.filter(team__name="bench provider").count()


def renter_keys(count: int) -> list[str]:
    """``count`` read API keys, each a renter's own (made afresh each run, so a kept database
    gets new ones)."""
    import secrets

    from marketplace.models import Membership, Role, Team, User
    from marketplace.services.accounts import api_key_create

    run = secrets.token_hex(3)
    keys = []
    for number in range(count):
        name = f"renter-{run}-{number}"
        user = User.objects.create_user(name, f"{name}@bench.invalid", None)
        membership = Membership.objects.filter(user=user, team__personal=True).first()
        if membership is None:
            team = Team.objects.create(name=name, personal=True)
            membership = Membership.objects.create(team=team, user=user, role=Role.OWNER)
        keys.append(api_key_create(membership=membership, name="bench", access="read").secret)
    return keys


def bounds():
    """What the seeded offers hold, for the generator's values."""
    from django.db.models import Max, Min
    from offer_queries import Bounds

    from marketplace.models import Offer, Team

    ids = Offer.objects.aggregate(Min("id"), Max("id"), Min("machine_id"), Max("machine_id"))
    return Bounds(
        offer_ids=(ids["id__min"], ids["id__max"]),
        machine_ids=(ids["machine_id__min"], ids["machine_id__max"]),
        host_id=Team.objects.get(name="bench provider").pk,
        gpu_names=tuple(gpu[0] for gpu in GPUS),
        regions=tuple(REGIONS),
        drivers=tuple(DRIVERS),
    )


class Client:
    """A user's API client: one keep-alive connection to each web process, and the renters'
    keys, each search on the next process with the next key."""

    def __init__(self, ports: list[int], keys: list[str]):
        self.connections = [http.client.HTTPConnection("127.0.0.1", p, timeout=60) for p in ports]
        self.keys = keys
        self.sent = 0

    def search(self, search) -> tuple[float, dict[str, float], dict]:
        """(milliseconds at the client, the web process's timings, the answer) of one search;
        a search the API refuses stops the bench."""
        connection = self.connections[self.sent % len(self.connections)]
        headers = {"Authorization": f"Bearer {self.keys[self.sent % len(self.keys)]}",
                   "Host": "localhost"}  # fmt: skip
        self.sent += 1
        if search.body is None:
            query = {"q": search.q, "limit": search.limit, "offset": search.offset}
            path, body = "/api/v1/offers/?" + urllib.parse.urlencode(query), None
        else:
            path, body = "/api/v1/offers/", json.dumps(search.body)
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            started = time.perf_counter()
            try:
                connection.request(search.method, path, body=body, headers=headers)
                response = connection.getresponse()
                answer = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The server closed a keep-alive connection left idle past its timeout, as
                # servers do: a client opens a new one and sends again (timed from there).
                connection.close()
                if attempt == 2:
                    raise
        elapsed = (time.perf_counter() - started) * 1000
        if response.status != 200:
            sys.exit(f"{search.label()}: {response.status} {answer[:300]!r}")
        return elapsed, server_timings(response), json.loads(answer)


def server_timings(response: http.client.HTTPResponse) -> dict[str, float]:
    """The milliseconds the web process says it took (``Server-Timing``): ``app``, the whole
    answer, and ``search``, the search's own work (the offer index, or SQL, and the page's
    rows) within it."""
    header = response.getheader("Server-Timing") or ""
    timings = {}
    for metric in header.split(","):
        name, _, parameters = metric.strip().partition(";")
        if parameters.startswith("dur="):
            timings[name] = float(parameters[len("dur=") :])
    if "app" not in timings or "search" not in timings:
        sys.exit(f"the web process sent no Server-Timing app and search durations: {header!r}")
    return timings


class RawSql:
    """The floor: a search's own statement run on a plain psycopg connection (client-side
    binding, as Django's backend sends it), its rows fetched."""

    def __init__(self):
        import dj_database_url
        import psycopg

        config = dj_database_url.parse(os.environ["DATABASE_URL"])
        self.connection = psycopg.connect(
            host=config["HOST"], port=config["PORT"] or 5432, user=config["USER"],
            password=config["PASSWORD"], dbname=config["NAME"], autocommit=True,
            cursor_factory=psycopg.ClientCursor,
        )  # fmt: skip

    def statement(self, search) -> tuple[str, tuple]:
        """The SQL the ORM writes for the search's page (one row more, as the view asks)."""
        from offer_queries import parsed

        from marketplace import offer_query
        from marketplace.api.offers import OFFER_COLUMNS
        from marketplace.models import Offer

        found = offer_query.apply(Offer.objects.all(), parsed(search)).values(*OFFER_COLUMNS)
        page = found[search.offset : search.offset + search.limit + 1]
        return page.query.sql_with_params()

    def time(self, search) -> tuple[float, int]:
        """(milliseconds, rows) of the search's statement."""
        from django.core.exceptions import EmptyResultSet

        try:
            sql, params = self.statement(search)
        except EmptyResultSet:  # the ORM knows nothing matches: no statement to run
            return 0.0, 0
        with self.connection.cursor() as cursor:
            started = time.perf_counter()
            cursor.execute(sql, params)
            rows = cursor.fetchall()
            return (time.perf_counter() - started) * 1000, len(rows)


@dataclass
class Line:
    """One line of searches timed: over HTTP, and each one's SQL right after it."""

    name: str
    http: list[float] = field(default_factory=list)
    server: list[float] = field(default_factory=list)
    search: list[float] = field(default_factory=list)  # the search's own work, server-side
    sql: list[float] = field(default_factory=list)
    searches: list = field(default_factory=list)

    def time(self, client: Client, raw: RawSql, searches) -> None:
        for search in searches:
            # Every other search runs its SQL first, so neither side always finds the
            # other's pages already in the cache.
            if len(self.http) % 2:
                sql, rows = raw.time(search)
                elapsed, timings, answer = client.search(search)
            else:
                elapsed, timings, answer = client.search(search)
                sql, rows = raw.time(search)
            page = len(answer["offers"]) + (answer["next_offset"] is not None)
            if page != rows:
                sys.exit(f"{search.label()}: the API answered {page} rows, its SQL {rows}")
            self.http.append(elapsed)
            self.server.append(timings["app"])
            self.search.append(timings["search"])
            self.sql.append(sql)
            self.searches.append(search)

    def our_part(self) -> float:
        """The median over searches of (answer − search) / search, both server-side: what
        the web process spends around a search per millisecond of the search itself."""
        return statistics.median(
            (a - s) / s for a, s in zip(self.server, self.search, strict=True) if s > 0
        )


def percentile(figures: list[float], fraction: float) -> float:
    ordered = sorted(figures)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


@dataclass(frozen=True)
class Figures:
    """A line's percentiles, milliseconds: server-side, at the client, the search's own work
    server-side, its raw SQL."""

    p50: float
    p99: float
    client50: float
    client99: float
    search50: float
    search99: float
    sql50: float
    sql99: float

    @classmethod
    def of(cls, line: Line) -> Figures:
        return cls(
            *(percentile(line.server, f) for f in (0.5, 0.99)),
            *(percentile(line.http, f) for f in (0.5, 0.99)),
            *(percentile(line.search, f) for f in (0.5, 0.99)),
            *(percentile(line.sql, f) for f in (0.5, 0.99)),
        )


def report(line: Line) -> Figures:
    """Print the line's figures beside its floors."""
    f = Figures.of(line)
    print(f"  {line.name}, {len(line.http)} searches (server-side; at the client; the search itself, server-side; the same search as raw SQL):")  # fmt: skip
    print(f"    p50 {f.p50:7.2f} ms   client {f.client50:6.2f} ms   search {f.search50:6.2f} ms   SQL {f.sql50:6.2f} ms   budget {P50_BUDGET_MS} ms   ratio {f.p50 / P50_BUDGET_MS:.2f}")  # fmt: skip
    print(f"    p99 {f.p99:7.2f} ms   client {f.client99:6.2f} ms   search {f.search99:6.2f} ms   SQL {f.sql99:6.2f} ms   budget {P99_BUDGET_MS} ms   ratio {f.p99 / P99_BUDGET_MS:.2f}")  # fmt: skip
    return f


def judged(generated: Line, fixed: Line, stack: Line) -> bool:
    """The budget, judged on the generated searches; the fixed line and the stack's floor
    printed beside it (the module's docstring says why they are not judged). True when
    within."""
    g = report(generated)
    ours = generated.our_part()
    print(f"    our part (answer − search) / search, median {ours:.2f}×   budget ≤ {OURS_BUDGET}×   ratio {ours / OURS_BUDGET:.2f}")  # fmt: skip
    print("    judged: the budget's workload (DESIGN.md)")
    f = report(fixed)
    n = Figures.of(stack)
    print(f"    our part (answer − search) / search, median {fixed.our_part():.2f}×")
    print(f"    the stack's floor, a search that reads nothing ({len(stack.http)}), server-side: p50 {n.p50:.2f} ms, p99 {n.p99:.2f} ms (at the client p50 {n.client50:.2f} ms); the fixed searches beyond it: p50 {f.p50 - n.p50:.2f} ms")  # fmt: skip
    print("    printed, not judged: a fixed handful of searches, kept to compare rounds")
    within = g.p50 <= P50_BUDGET_MS and g.p99 <= P99_BUDGET_MS and ours <= OURS_BUDGET
    budget_row(
        "offer_search.py",
        budget=f"generated searches, server-side: p50 ≤ {P50_BUDGET_MS} ms, p99 ≤ {P99_BUDGET_MS} ms, ours ≤ {OURS_BUDGET}× the search",  # fmt: skip
        figure=f"p50 {g.p50:.1f} ms, p99 {g.p99:.1f} ms (at the client {g.client50:.1f}, {g.client99:.1f} ms), ours {ours:.2f}×",  # fmt: skip
        floor=f"the search itself p50 {g.search50:.1f} ms, p99 {g.search99:.1f} ms;"
        f" the same searches as raw SQL p50 {g.sql50:.1f} ms, p99 {g.sql99:.1f} ms;"
        f" not judged: the fixed searches p50 {f.p50:.1f} ms, p99 {f.p99:.1f} ms (their SQL p50 {f.sql50:.1f} ms),"
        f" a search that reads nothing p50 {n.p50:.1f} ms",
        ratio=round(max(g.p50 / P50_BUDGET_MS, g.p99 / P99_BUDGET_MS, ours / OURS_BUDGET), 2),
        within=within,
    )
    return within


def slowest(line: Line, count: int = 5) -> None:
    ranked = sorted(zip(line.http, line.sql, line.searches, strict=True), key=lambda x: -x[0])
    print(f"  the {count} slowest {line.name} searches (HTTP, SQL):")
    for http_ms, sql_ms, search in ranked[:count]:
        print(f"    {http_ms:8.2f} {sql_ms:8.2f} ms  {search.label()[:160]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--offers", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=400, help="generated searches")
    parser.add_argument("--seed", type=int, default=34, help="the generator's seed")
    parser.add_argument(
        "--fixed-rounds", type=int, default=20, help="times over the fixed searches"
    )
    parser.add_argument("--keys", type=int, default=100, help="renters' API keys, used in turn")
    parser.add_argument(
        "--reuse", action="store_true",
        help="measure the offers an earlier --reuse run seeded, and keep the database",
    )  # fmt: skip
    args = parser.parse_args()
    with private_redis(REDIS), scratch_database(keep=args.reuse) as existed:
        from offer_queries import Search, coverage, generate, parsed

        if existed:
            machines = reused_count(args.offers)
            print(f"reusing the {args.offers:,} offers seeded earlier")
        else:
            started = time.perf_counter()
            machines = populate(args.offers)
            print(f"populated {args.offers:,} offers in {time.perf_counter() - started:.1f}s")
        print(f"  {args.offers:,} offers (GPU-count bundles) on {machines:,} machines")
        generated = generate(args.seed, args.queries, bounds())
        for search in generated:
            parsed(search)  # a search the language refuses is the generator's bug: say so now
        missing = coverage(generated)
        fixed = [Search(q=q, limit=64, offset=0) for q in QUERIES] * args.fixed_rounds
        keys = renter_keys(args.keys)
        raw = RawSql()
        with web_processes(REDIS) as cluster:  # logging as production does
            client = Client(cluster.web_ports, keys)
            # Both processes: connections, imports, and each one's offer index loaded.
            for search in fixed[: len(QUERIES) * 2]:
                client.search(search)
            lines = [Line("generated"), Line("fixed"), Line("stack")]
            nothing = [Search(q="id=0", limit=1, offset=0)] * len(fixed)
            # The lines take turns, a block of each, so all see the same load.
            block = 20
            for start in range(0, max(len(generated), len(fixed)), block):
                lines[0].time(client, raw, generated[start : start + block])
                lines[1].time(client, raw, fixed[start : start + block])
                lines[2].time(client, raw, nothing[start : start + block])
    print(
        f"offer search, {args.offers:,} offers, over HTTP to 2 web processes, {args.keys} keys"
        f" (seed {args.seed}; every search beside its own SQL run raw):"
    )
    print(
        "  the generated searches use every field with every operator it takes"
        if not missing
        else f"  not drawn ({len(missing)} field/operator pairs; more --queries draws them): "
        + ", ".join(f"{n}{op}" for n, op in sorted(missing))
    )
    within = judged(*lines)
    slowest(lines[0])
    print(f"  load average {os.getloadavg()[0]:.2f}")
    print("  within budget" if within else "  OVER BUDGET")
    if not within:
        sys.exit(1)


if __name__ == "__main__":
    main()
