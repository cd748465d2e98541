"""The in-memory offer index (marketplace/offer_index.py) answers every search as the SQL of
``offer_query.apply`` does: the same offers in the same order, page for page, over searches
drawn by the bench's generator (bench/offer_queries.py: every field and operator, varied
values, sorts either way, pages), on a market of real machines whose offers ``offers_refresh``
wrote, and again after machines are re-listed, repriced, lose GPUs, are deleted or added, and
after raw SQL rewrites offers (the index sees every writer, through the table's triggers).

These tests commit their rows (``transactional_db``): the index reads committed data and
serves only outside a transaction, so a test inside one (``db``) is answered by SQL, and the
flush between tests (a TRUNCATE) makes the index load afresh.
"""

from __future__ import annotations

import itertools
import random
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from django.db import connection, transaction
from django.db.models import Max, Min
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hosts.models import Gpu, Machine
from marketplace import offer_index, offer_query
from marketplace.api.offers import OFFER_COLUMNS, search_offer_rows, search_offers
from marketplace.models import Offer, Role
from marketplace.services.offers import offers_refresh
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from offer_queries import Bounds, Search, generate, parsed  # noqa: E402

GPU_MODELS = [
    "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090", "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100 PCIE 40GB", "NVIDIA H100-SXM5-80GB", "NVIDIA L40S", "NVIDIA RTX A6000",
]  # fmt: skip
SEARCHED_GPUS = ("RTX 4090", "RTX 3090", "A100", "A100-SXM4-80GB", "H100-SXM5-80GB", "L40S",
                 "RTX A6000", "RTX")  # fmt: skip
REGIONS = ("US", "CA", "DE", "JP", "BR", "us")
DRIVERS = ("535.183.01", "550.54.14", "555.42.02")
ADDRESSES = itertools.count()  # a machine's address is unique to its provider


@pytest.fixture
def small_index(monkeypatch):
    """The index's thresholds scaled to a market of hundreds of offers, so its walks in a
    field's order, the ties it ranks by the next field, the rows it merges into an order and
    its compaction all run here as they do at a million."""
    monkeypatch.setattr(offer_index, "DIRECT", 8)
    monkeypatch.setattr(offer_index, "MERGE_AT", 16)
    monkeypatch.setattr(offer_index, "COMPACT_AT", 40)


@pytest.fixture
def provider(transactional_db):
    team = TeamFactory(name="Provider")
    add_member(team, UserFactory(username="provider"), Role.OWNER)
    return team


def machines_listed(provider, rng: random.Random, count: int) -> list[Machine]:
    """``count`` machines as providers list them, drawn by ``rng``, their offers refreshed."""
    now = timezone.now()
    machines = Machine.objects.bulk_create(
        [
            Machine(
                team=provider, name=f"m{rng.random()}", address=rng.choice(
                    [f"10.1.{i // 250}.{i % 250}", f"host{i}.example.org"]),
                status=rng.choice(["online"] * 6 + ["offline"]), listed=rng.random() < 0.9,
                price_per_gpu_hour=rng.choice([200_000, 450_000, 900_000, rng.randint(1, 4_000_000)]),
                storage_price_per_gb_month=rng.choice([50_000, 100_000, 150_000]),
                min_gpus=rng.choice([1, 1, 1, 2]),
                min_bid_price_per_gpu_hour=rng.choice([None, 100_000, rng.randint(1, 900_000)]),
                end_date=rng.choice([None, now + timedelta(days=rng.uniform(0.5, 400))]),
                location=rng.choice(REGIONS), cpu_cores=rng.choice([8, 16, 32, 64]),
                ram_mb=rng.choice([65536, 131072]), disk_free_gb=rng.choice([500, 2000]),
                reliability=rng.choice([0.9, 0.99, round(rng.uniform(0.8, 1), 4)]),
                driver_version=rng.choice(DRIVERS), cuda_version=rng.choice(["11.8", "12.2", "12.4"]),
                verified=rng.random() < 0.7, port_range_end=20000 + rng.choice([9, 99, 999]),
                compute_cap=rng.choice([800, 860, 890, 900]), tflops_per_gpu=rng.choice([19.5, 82.6]),
                gpu_mem_bw=rng.choice([936.0, 2039.0]), dlperf_per_gpu=rng.choice([30.0, 55.0, 120.0]),
                inet_up=round(rng.uniform(50, 10_000), 1), inet_down=round(rng.uniform(50, 10_000), 1),
                disk_read_mbps=round(rng.uniform(200, 5000), 1),
                sharing_enabled=rng.random() < 0.2,  # its offers list their cards
            )
            for i in itertools.islice(ADDRESSES, count)
        ]
    )  # fmt: skip
    gpus = []
    for machine in machines:
        model = rng.choice(GPU_MODELS)
        for index in range(rng.choice([1, 2, 3, 4, 8, 8])):
            gpus.append(
                Gpu(machine=machine, index=index, name=model, memory_mib=rng.choice([24564, 81920]),
                    uuid=f"GPU-{machine.pk:08d}-{index:04d}", present=rng.random() < 0.95)
            )  # fmt: skip
    Gpu.objects.bulk_create(gpus)
    offers_refresh([m.pk for m in machines])
    return machines


def bounds(provider) -> Bounds:
    ids = Offer.objects.aggregate(Min("id"), Max("id"), Min("machine_id"), Max("machine_id"))
    return Bounds(
        offer_ids=(ids["id__min"], ids["id__max"]),
        machine_ids=(ids["machine_id__min"], ids["machine_id__max"]),
        host_id=provider.pk, gpu_names=SEARCHED_GPUS, regions=REGIONS, drivers=DRIVERS,
    )  # fmt: skip


def sql_page(query: offer_query.OfferQuery, limit: int, offset: int) -> list[int]:
    found = offer_query.apply(Offer.objects.all(), query).values_list("id", flat=True)
    return list(found[offset : offset + limit])


def agree(searches, total: int) -> int:
    """Each search's page from the index and from SQL are the same ids in the same order;
    returns how many pages held offers. Deep offsets are scaled to the market."""
    pages = 0
    for search in searches:
        query = parsed(search)
        offset = search.offset % (total // 2 + 1)
        found = offer_index.page_ids(query, search.limit, offset)
        assert found is not None, "the index must serve outside a transaction"
        assert found == sql_page(query, search.limit, offset), search.label()
        # The page's offers as the API shows them, read from the index: what SQL reads.
        rows = offer_index.page_rows(query, search.limit, offset, OFFER_COLUMNS)
        with transaction.atomic():  # the index does not serve here: SQL answers
            assert rows == search_offer_rows(query, search.limit, offset), search.label()
        if pages % 10 == 0:  # the v0 API's search, as model instances
            offers = search_offers(query, search.limit, offset)
            assert [offer.pk for offer in offers] == found
        pages += bool(found)
    return pages


def test_generated_searches_agree_with_sql(provider, small_index):
    listed = machines_listed(provider, random.Random(7), 260)
    assert Offer.objects.count() > 500 and len(listed) == 260
    edges = bounds(provider)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 2**32 - 1))
    def searches_agree(seed):
        agree(generate(seed, 16, edges), Offer.objects.count())

    searches_agree()
    # The bench's own seed over the whole language: most pages hold offers.
    assert agree(generate(34, 400, edges), Offer.objects.count()) > 120


def test_searches_agree_after_the_market_changes(provider, small_index):
    rng = random.Random(11)
    machines = machines_listed(provider, rng, 200)
    edges = bounds(provider)
    agree(generate(1, 40, edges), Offer.objects.count())  # the index is loaded
    for round_ in range(6):
        changing = rng.sample(machines, 30)
        for machine in changing[:10]:  # delisted, relisted, repriced, offline
            machine.listed = rng.random() < 0.5
            machine.price_per_gpu_hour = rng.randint(1, 3_000_000)
            machine.status = rng.choice(["online", "offline"])
            machine.save()
        Gpu.objects.filter(machine__in=changing[10:20], index=0).update(present=False)
        offers_refresh([m.pk for m in changing[:20]])  # bundles change size or go
        gone = changing[20:23]
        Machine.objects.filter(pk__in=[m.pk for m in gone]).delete()  # their offers cascade
        machines = [m for m in machines if m not in gone]
        machines += machines_listed(provider, rng, 5)
        with connection.cursor() as cursor:  # a writer outside the refresh
            cursor.execute(
                "UPDATE marketplace_offer SET dlperf = dlperf + 1, gpu_name = %s "
                "WHERE machine_id = ANY(%s)",
                [f"NVIDIA B200 rev{round_}", [m.pk for m in changing[23:26]]],
            )
        edges = bounds(provider)
        assert agree(generate(100 + round_, 60, edges), Offer.objects.count()) > 10


def test_searches_agree_while_a_few_changed_offers_wait_outside_the_orders(provider, small_index):
    """A changed machine's offers are appended to the index and join each field's order only
    once ``MERGE_AT`` rows wait; until then a search finds them beside the orders: a term read
    from an order's stretches, the rows tied on a flag, a sort."""
    rng = random.Random(5)
    machines = machines_listed(provider, rng, 160)
    edges = bounds(provider)
    agree(generate(2, 20, edges), Offer.objects.count())  # loaded, every order made
    changed = next(m for m in machines if Offer.objects.filter(machine=m).count() >= 2)
    changed.price_per_gpu_hour = 1  # now the cheapest: first in a price order
    changed.save()
    offers_refresh([changed.pk])
    other = next(m for m in machines if m != changed and Offer.objects.filter(machine=m).exists())
    targeted = [
        f"machine_id={changed.pk} rentable=any",
        f"machine_id in [{changed.pk},{other.pk}] rentable=any -o dph_total",
        "rentable=any -o dph_total",
        "rentable=any -o verified,dph_total",
        f"machine_id>={changed.pk} rentable=any -o datacenter-,dph_total",
    ]
    agree([Search(q=q, limit=limit, offset=0) for q in targeted for limit in (1, 3, 40)], 0)
    # The waiting offers are found: by their machine, and first by price.
    theirs = sorted(Offer.objects.filter(machine=changed).values_list("id", flat=True))
    assert sorted(offer_index.page_ids(parsed(Search(targeted[0], 40, 0)), 40, 0)) == theirs
    cheapest = offer_index.page_ids(parsed(Search(targeted[2], 40, 0)), 1, 0)
    assert cheapest is not None and cheapest[0] in theirs
    waiting = offer_index.INDEX.n - offer_index.INDEX.perms["dph_total"][1]
    assert 0 < waiting < offer_index.MERGE_AT  # the state this test is about
    assert agree(generate(3, 60, edges), Offer.objects.count()) > 10


def test_a_price_past_32_bits_arriving_later_is_searched_and_sorted_exactly(provider):
    """Whole-number columns are held in 32 bits while their values fit. A machine re-priced
    past that ($5,000 a GPU-hour is 5e9 micro-dollars) widens the column: it is found by
    price and sorts first by price, as SQL has it, never wrapped round to a small number."""
    machines = machines_listed(provider, random.Random(9), 40)
    agree(generate(4, 10, bounds(provider)), Offer.objects.count())  # loaded
    assert offer_index.INDEX.columns["dph_total"].dtype == np.int32  # the state this test is about
    dear = next(m for m in machines if Offer.objects.filter(machine=m).exists())
    dear.price_per_gpu_hour = 5_000 * 1_000_000
    dear.save()
    offers_refresh([dear.pk])
    theirs = sorted(Offer.objects.filter(machine=dear).values_list("id", flat=True))
    assert Offer.objects.filter(pk__in=theirs, dph_total__gt=2**31).exists()
    targeted = [
        "rentable=any dph_total>4000 -o dph_total",
        "rentable=any -o dph_total-",
        "rentable=any dph_per_gpu>=5000",
        "rentable=any dph_total<1 -o dph_total-",
    ]
    agree([Search(q=q, limit=limit, offset=0) for q in targeted for limit in (1, 5, 40)], 0)
    found = offer_index.page_ids(parsed(Search(targeted[0], 40, 0)), 40, 0)
    assert found is not None and sorted(found) == theirs
    assert offer_index.INDEX.columns["dph_total"].dtype == np.int64


def test_a_search_sees_a_change_committed_before_it(provider):
    """Through the API: a machine delisted, or a new one listed, shows in the next search."""
    machines = machines_listed(provider, random.Random(3), 30)
    api = key_client(provider)

    def offered(q: str) -> set[int]:
        response = api.get("/api/v1/offers/", {"q": q, "limit": 256})
        assert response.status_code == 200
        return {offer["machine_id"] for offer in response.json()["offers"]}

    before = offered("rentable=any")
    assert before == {m.pk for m in machines if Offer.objects.filter(machine=m).exists()}
    shown = next(iter(offered("")))
    Machine.objects.filter(pk=shown).update(listed=False)
    offers_refresh([shown])
    assert shown not in offered("")
    new = machines_listed(provider, random.Random(4), 1)[0]
    new.listed, new.status = True, "online"
    new.save()
    offers_refresh([new.pk])
    assert new.pk in offered("rentable=any")


def test_the_check_before_each_search_is_planned_once_per_pooled_connection(provider):
    """Before each search the index asks what changed; on a pooled connection that question
    is a prepared statement after a few searches, and a search still sees a change committed
    before it."""
    machine = machines_listed(provider, random.Random(8), 1)[0]
    query = offer_query.parse(f"machine_id={machine.pk} rentable=any")
    offered = sorted(Offer.objects.filter(machine=machine).values_list("id", flat=True))
    for _ in range(8):
        assert sorted(offer_index.page_ids(query, 10, 0)) == offered
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("marketplace_offer_change" in statement for statement in prepared)
    Machine.objects.filter(pk=machine.pk).delete()  # its offers cascade
    assert offer_index.page_ids(query, 10, 0) == []


def test_inside_a_transaction_sql_answers(provider):
    machines_listed(provider, random.Random(5), 5)
    query = offer_query.parse("")
    assert offer_index.page_ids(query, 10, 0) is not None
    with transaction.atomic():
        assert offer_index.page_ids(query, 10, 0) is None


@pytest.mark.django_db
def test_a_test_transaction_is_answered_by_sql():
    """In a test's transaction (``db``), rows only it sees are found: SQL answers."""
    team = TeamFactory(name="Only here")
    add_member(team, UserFactory(username="only-here"), Role.OWNER)
    machine = machines_listed(team, random.Random(6), 1)[0]
    assert offer_index.page_ids(offer_query.parse(""), 10, 0) is None
    response = key_client(team).get("/api/v1/offers/", {"q": "rentable=any"})
    assert {o["machine_id"] for o in response.json()["offers"]} == {machine.pk}
