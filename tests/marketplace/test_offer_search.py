"""Offer search on the database, through the API and the console: filters, sorts, the default
rentable filter and ``any``, pages, the JSON filter body, and every kind of bad query (400 with
the position, the token and the reason; never a 500).

An offer is a bundle of a machine's GPUs (1, 2, 4…): results are named ``machine×GPUs``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hosts.models import Gpu, Machine
from marketplace.models import Offer, Role
from marketplace.services.offers import offer_refresh
from tests.conftest import client_for, key_client
from tests.factories import TeamFactory, UserFactory, add_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider(db):
    team = TeamFactory(name="Provider")
    add_member(team, UserFactory(username="provider"), Role.OWNER)
    return team


def offer_on(
    provider,
    name: str,
    *,
    gpus: int = 1,
    gpu_name: str = "NVIDIA GeForce RTX 4090",
    price: float = 0.5,
    location: str = "US",
    reliability: float = 0.99,
    end_in_days: float | None = None,
    listed: bool = True,
    status: str = "online",
) -> Offer:
    """A machine as the provider lists it, and the offer search reads; returns its offer of
    all its GPUs (each smaller bundle is an offer too)."""
    machine = Machine.objects.create(
        team=provider, name=name, address=f"10.0.{Machine.objects.count()}.1", status=status,
        listed=listed, price_per_gpu_hour=round(price * 1_000_000),
        storage_price_per_gb_month=100_000, location=location, cpu_cores=8 * gpus,
        ram_mb=32768 * gpus, disk_free_gb=500 * gpus, reliability=reliability,
        end_date=timezone.now() + timedelta(days=end_in_days) if end_in_days else None,
        driver_version="550.54.14", cuda_version="12.4",
    )  # fmt: skip
    Gpu.objects.bulk_create(
        [
            Gpu(machine=machine, index=i, uuid=f"GPU-{machine.pk:08d}-0000-0000-0000-{i:012d}",
                name=gpu_name, memory_mib=24564)
            for i in range(gpus)
        ]
    )  # fmt: skip
    return offer_refresh(machine_id=machine.pk)


@pytest.fixture
def market(provider):
    """Seven machines: six rentable, one unlisted."""
    return {
        "cheap": offer_on(provider, "cheap", gpus=1, price=0.2, location="CA", reliability=0.9),
        "pair": offer_on(provider, "pair", gpus=2, price=0.5, location="US"),
        "quad": offer_on(provider, "quad", gpus=4, price=0.8, location="US", end_in_days=3),
        "eight": offer_on(provider, "eight", gpus=8, price=0.6, location="EU", end_in_days=40),
        "a100": offer_on(provider, "a100", gpus=2, gpu_name="NVIDIA A100 80GB", price=1.9,
                         location="EU", reliability=0.999),
        "shaky": offer_on(provider, "shaky", gpus=1, price=0.3, location="AS", reliability=0.5),
        "unlisted": offer_on(provider, "unlisted", gpus=2, price=0.05, listed=False),
    }  # fmt: skip


@pytest.fixture
def api(team, owner):
    return key_client(team)


def names(response) -> list[str]:
    """The offers found, in order, as ``machine×GPUs``."""
    assert response.status_code == 200, response.content
    by_id = dict(Machine.objects.values_list("pk", "name"))
    return [f"{by_id[o['machine_id']]}×{o['num_gpus']}" for o in response.json()["offers"]]


def machines(response) -> list[str]:
    """The machines of the offers found, each once, in the order first found."""
    return list(dict.fromkeys(name.split("×")[0] for name in names(response)))


def search(api, q: str, **params):
    return api.get("/api/v1/offers/", {"q": q, **params})


def test_filters_combine_and_units_are_as_documented(api, market):
    # dph_total is for the bundle: 8 × $0.60 = $4.80 is over $4; 4 × $0.80 is under.
    assert sorted(names(search(api, "num_gpus>=2 geolocation in [US,EU] dph_total<4"))) == [
        "a100×2", "eight×2", "eight×4", "pair×2", "quad×2", "quad×4",
    ]  # fmt: skip
    assert sorted(names(search(api, "num_gpus>=2 geolocation in [US,EU] dph_total<3"))) == [
        "eight×2", "eight×4", "pair×2", "quad×2",
    ]  # fmt: skip
    assert names(search(api, "gpu_name=A100_80GB")) == ["a100×1", "a100×2"]
    assert names(search(api, "gpu_name=a100_80gb")) == ["a100×1", "a100×2"]  # any case
    assert sorted(names(search(api, "geolocation notin [US,EU,CA]"))) == ["shaky×1"]
    assert sorted(names(search(api, "reliability>0.95 gpu_ram>=20 num_gpus!=2"))) == [
        "a100×1", "eight×1", "eight×4", "eight×8", "pair×1", "quad×1", "quad×4",
    ]  # fmt: skip
    assert sorted(names(search(api, "cpu_cores_effective>=32 disk_space>=2000"))) == [
        "eight×4", "eight×8", "quad×4",
    ]  # fmt: skip


@pytest.fixture
def families(provider):
    """A100s of two models beside an A10 and an A100 no one lists."""
    return {
        "sxm": offer_on(provider, "sxm", gpu_name="NVIDIA A100-SXM4-80GB", price=1.5),
        "pcie": offer_on(provider, "pcie", gpu_name="NVIDIA A100-PCIE-40GB", price=1.1),
        "a10": offer_on(provider, "a10", gpu_name="NVIDIA A10", price=0.4),
        "off": offer_on(provider, "off", gpu_name="NVIDIA A100-SXM4-40GB", listed=False),
        "rtx": offer_on(provider, "rtx", price=0.3),
    }


@pytest.mark.parametrize("console_or_api", ["api", "console"])
def test_a_gpu_family_matches_its_models_and_exact_names_stay_exact(
    api, console, families, console_or_api
):
    def found(q: str) -> list[str]:
        if console_or_api == "api":
            return sorted(machines(search(api, q)))
        found_ids = set(page_machines(console.get("/offers/", {"q": q})))
        return sorted(name for name, offer in families.items() if offer.machine_id in found_ids)

    assert found("gpu_name=A100") == ["pcie", "sxm"]
    assert found("gpu_name=a100 -o dph_total") == ["pcie", "sxm"]
    assert found("gpu_name=A100-SXM4-80GB") == ["sxm"]
    assert found("gpu_name=A10") == ["a10"]  # not the A100s: a family ends at - or a space
    assert found("gpu_name in [A10,RTX_4090]") == ["a10", "rtx"]
    assert found("gpu_name!=A100") == ["a10", "rtx"]
    assert found("gpu_name notin [A100,A10]") == ["rtx"]
    assert found("gpu_name=H100") == []
    # Unlisted offers too, where the search asks for them (matched by prefix there).
    assert found("gpu_name=A100 rentable=any") == ["off", "pcie", "sxm"]


def test_duration_is_days_until_the_end_date_and_no_end_date_is_forever(api, market):
    assert "quad" not in machines(search(api, "duration>=7"))
    assert "eight" in machines(search(api, "duration>=7"))
    assert "pair" in machines(search(api, "duration>=7"))  # no end date: rentable for ever
    assert machines(search(api, "duration<7")) == ["quad"]


def test_sorts_ascending_descending_and_by_two_fields(api, market):
    offers = Offer.objects.select_related("machine").filter(rentable=True)
    totals = {f"{o.machine.name}×{o.num_gpus}": o.dph_total for o in offers}
    assert len(set(totals.values())) == len(totals) == 13  # no two at one price
    by_price = names(search(api, "-o dph_total"))
    assert by_price == sorted(totals, key=lambda n: totals[n])
    assert by_price[:3] == ["cheap×1", "shaky×1", "pair×1"]
    assert names(search(api, "-o dph_total-")) == by_price[::-1]
    # Ties (a region's bundles of one size) go by offer id: here, the order they were made.
    by_region_then_gpus = names(search(api, "-o geolocation,num_gpus-"))
    assert by_region_then_gpus == [
        "shaky×1", "cheap×1", "eight×8", "eight×4", "eight×2", "a100×2", "eight×1", "a100×1",
        "quad×4", "pair×2", "quad×2", "pair×1", "quad×1",
    ]  # fmt: skip
    # The default is the value score, best first.
    scores = [o["score"] for o in search(api, "").json()["offers"]]
    assert scores == sorted(scores, reverse=True)


def test_any_drops_the_default_rentable_filter(api, market):
    assert "unlisted" not in machines(search(api, ""))
    everything = names(search(api, "rentable=any -o dph_total"))
    assert everything[0] == "unlisted×1" and len(everything) == 15
    body = search(api, "rentable=any machine_id=" + str(market["unlisted"].machine_id)).json()
    assert body["offers"][0]["rentable"] is False
    assert names(search(api, "rentable=false")) == ["unlisted×1", "unlisted×2"]


def test_a_search_like_an_earlier_one_answers_with_its_own_values(api, market, provider):
    """Each process compiles a shape of search once (its fields, operators, list lengths,
    true/false values and order) and runs it with each search's own values: a like search
    with other numbers, words or lists, another page, or the same search after offers
    changed, each answers for itself."""
    assert names(search(api, "num_gpus>=2 -o dph_total")) == [
        "pair×2", "eight×2", "quad×2", "eight×4", "quad×4", "a100×2", "eight×8",
    ]  # fmt: skip
    assert names(search(api, "num_gpus>=4 -o dph_total")) == ["eight×4", "quad×4", "eight×8"]
    assert names(search(api, "num_gpus>=2 -o dph_total", limit=1, offset=1)) == ["eight×2"]
    assert sorted(machines(search(api, "geolocation in [US,CA]"))) == ["cheap", "pair", "quad"]
    assert sorted(machines(search(api, "geolocation in [EU,AS]"))) == ["a100", "eight", "shaky"]
    assert sorted(machines(search(api, "geolocation in [AS]"))) == ["shaky"]
    assert names(search(api, "gpu_name=A100_80GB dph_total<4")) == ["a100×1", "a100×2"]
    assert names(search(api, "gpu_name=RTX_4090 dph_total<0.25")) == ["cheap×1"]
    assert names(search(api, "rentable=false")) == ["unlisted×1", "unlisted×2"]
    assert "unlisted" not in machines(search(api, "rentable=true"))
    # Numbers past a column's range match nothing, or everything, as they say.
    assert names(search(api, "num_gpus>=100000")) == []
    assert len(names(search(api, "num_gpus<100000 machine_id!=1000000000000"))) == 13
    Offer.objects.filter(pk=market["eight"].pk).update(dph_total=100_000)
    offer_on(provider, "late", gpus=2, price=0.4)
    Offer.objects.filter(pk=market["a100"].pk).update(rentable=False)
    assert names(search(api, "num_gpus>=2 -o dph_total")) == [
        "eight×8", "late×2", "pair×2", "eight×2", "quad×2", "eight×4", "quad×4",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "q",
    [
        "",
        "rentable=any -o dph_total",
        "num_gpus>=2 gpu_name=RTX_4090 reliability>0.98 dph_total<4 geolocation in [US,CA,EU]",
        "gpu_name=A100 -o dph_total",
        "gpu_name notin [A100,RTX] rentable=any",
        "geolocation notin [US,CA] verified=false -o reliability-",
        "num_gpus!=2 min_bid!=0.5 -o gpu_total_ram-,disk_space",
        "cpu_cores_effective>=8 cpu_ram<=1000 storage_cost<=0.1 sharing=false -o score",
        "duration>=7 -o duration-",
        "machine_id!=1000000000000 num_gpus<100000 -o machine_id",
        "id>=1 host_id!=0 cpu_cores>=8 static_ip=true datacenter=false -o cpu_cores-,id-",
        "direct_port_count>=1 dph_per_gpu<=0.8 rented=false -o dph_per_gpu",
    ],
)
def test_a_search_reads_the_rows_the_orm_composes(market, q):
    """The API runs each search's statement itself with the search's values; its rows must
    be those the ORM's own query gives, converted alike (cards, dates, bids)."""
    from marketplace import offer_query
    from marketplace.api.offers import OFFER_COLUMNS, search_offer_rows

    cards = [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "free_core_percent": 50}]
    Offer.objects.filter(pk=market["quad"].pk).update(cards=cards, min_bid=400_000)
    query = offer_query.parse(q)
    composed = offer_query.apply(Offer.objects.all(), query).values(*OFFER_COLUMNS)
    assert search_offer_rows(query, 64, 0) == list(composed[:64])
    assert search_offer_rows(query, 2, 1) == list(composed[1:3])


def test_pages_follow_next_offset_to_the_end(api, market):
    seen, offset = [], 0
    while offset is not None:
        response = search(api, "-o dph_total", limit=4, offset=offset)
        seen += names(response)
        offset = response.json()["next_offset"]
    assert seen == names(search(api, "-o dph_total", limit=64))
    assert len(seen) == 13
    assert names(search(api, "-o dph_total", limit=2, offset=2)) == seen[2:4]


def test_json_filter_body_means_the_same_as_the_query_language(api, market):
    body = {
        "num_gpus": {"gte": 2},
        "geolocation": {"in": ["US", "EU"]},
        "order": [["dph_total", "desc"]],
        "limit": 3,
    }
    response = api.post("/api/v1/offers/", body, format="json")
    assert names(response) == names(
        search(api, "num_gpus>=2 geolocation in [US,EU] -o dph_total-", limit=3)
    )
    assert response.json()["next_offset"] == 3
    assert "unlisted" in machines(api.post("/api/v1/offers/", {"rentable": "any"}, format="json"))
    as_text = api.post("/api/v1/offers/", {"q": "gpu_name=A100_80GB"}, format="json")
    assert names(as_text) == ["a100×1", "a100×2"]


@pytest.mark.parametrize(
    ("q", "says"),
    [
        ("duration in [1,2]", "at position 0 ('duration in [1,2]'): duration takes < <= > >="),
        ("duration notin [1]", "duration takes < <= > >="),
        ("num_gpus>=1 duration=3", "at position 12 ('duration=3'): duration takes < <= > >="),
        ("duration!=3", "not '!='"),
        ("duration>=1e9", "out of range"),
        ("num_gpus>=2 gpu_nmae=RTX", "at position 12 ('gpu_nmae=RTX'): unknown field 'gpu_nmae'"),
        ("-o price", "at position 3 ('price'): cannot sort by unknown field 'price'"),
        ("gpu_name=RTX\x00", "control characters"),
        ("geolocation in [US,\x01CA]", "at position 19 ("),
        ("num_gpus>=two", "needs a number, not 'two'"),
        ("dph_total<1e400", "out of range"),
    ],
)
def test_bad_queries_answer_400_with_the_position_token_and_reason(api, market, q, says):
    response = search(api, q)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert says in error["fields"]["q"][0], error


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"duration": {"in": [1, 2]}}, "filters", "at 'duration.in': duration takes"),
        ({"duration": 3}, "filters", "at 'duration.eq': duration takes"),
        ({"num_gpus": {"approx": 2}}, "filters", "unknown operator 'approx'"),
        ({"gpu_nmae": "RTX 4090"}, "filters", "unknown field 'gpu_nmae'"),
        ({"order": [["dph_total"]]}, "filters", "order must be a list"),
        ({"order": "dph_total"}, "filters", "order must be a list"),
        ({"order": [["price", "asc"]]}, "filters", "cannot sort by unknown field 'price'"),
        ({"gpu_name": "RTX\u0000"}, "filters", "control characters"),
        ({"q": 5}, "q", "The query is text"),
        ({"q": "duration in [1]"}, "q", "at position 0"),
        ([{"num_gpus": 2}], "filters", "The filter body is a JSON object"),
        ({"limit": 0}, "limit", "Between 1 and 256"),
        ({"offset": "x"}, "offset", "A valid integer is required"),
        ({"offset": 10**9}, "offset", "at most 10000 offers deep"),
        ({"limit": "NaN"}, "limit", "A valid integer is required"),
    ],
)
def test_bad_json_filter_bodies_answer_400_naming_the_field(api, market, body, field, says):
    response = api.post("/api/v1/offers/", body, format="json")
    assert response.status_code == 400, response.content
    assert says in " ".join(response.json()["error"]["fields"][field])


# --- the console ---------------------------------------------------------------------------


@pytest.fixture
def console(client, owner, team):
    return client_for(client, owner, team)


def page_machines(response) -> list[int]:
    import re

    return [int(m) for m in re.findall(r'<tr data-machine="(\d+)"', response.content.decode())]


def test_console_search_filters_and_sorts_like_the_api(console, api, market):
    response = console.get("/offers/", {"q": "num_gpus>=2 -o dph_total-"})
    assert response.status_code == 200
    by_api = [o["machine_id"] for o in search(api, "num_gpus>=2 -o dph_total-").json()["offers"]]
    assert page_machines(response) == by_api
    form = console.get("/offers/", {"geolocation": "EU", "min_gpus": "4", "sort": "dph_total"})
    assert page_machines(form) == [market["eight"].machine_id] * 2  # its 4 and 8 GPUs
    everything = console.get("/offers/", {"q": "rentable=any"})
    assert market["unlisted"].machine_id in page_machines(everything)
    assert "not rentable" in everything.content.decode()


@pytest.mark.parametrize(
    ("q", "says"),
    [
        ("duration in [1,2]", "at position 0 (&#x27;duration in [1,2]&#x27;): duration takes"),
        ("duration=3", "duration takes &lt; &lt;= &gt; &gt;="),
        ("num_gpus>=2 gpu_nmae=RTX", "at position 12"),
    ],
)
def test_console_bad_query_is_400_and_shows_where_and_why(console, market, q, says):
    response = console.get("/offers/", {"q": q})
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="query-error"' in page and says in page
    assert page_machines(response) == []
    assert "No offers match" not in page  # the error is the answer, not an empty market


def test_console_pages_through_offers_64_at_a_time(console, provider):
    for n in range(70):
        offer_on(provider, f"m{n:02d}", price=0.1 + n / 100)
    first = console.get("/offers/", {"sort": "dph_total"})
    page = first.content.decode()
    assert len(page_machines(first)) == 64
    assert 'id="previous-page"' not in page and 'id="next-page"' in page
    assert "offers 1–64" in page
    second = console.get("/offers/", {"sort": "dph_total", "page": "2"})
    assert len(page_machines(second)) == 6
    text = second.content.decode()
    assert 'id="next-page"' not in text and "offers 65–70" in text
    assert 'href="?sort=dph_total&amp;page=1"' in text  # the filters travel with the page
    cheapest_last = Machine.objects.get(name="m69").pk
    assert page_machines(second)[-1] == cheapest_last
    assert set(page_machines(first)).isdisjoint(page_machines(second))
    past_the_end = console.get("/offers/", {"sort": "dph_total", "page": "9"}).content.decode()
    assert "No more offers on page 9" in past_the_end and 'id="first-page"' in past_the_end


def test_the_offer_representation_is_what_the_declared_fields_give(market):
    """The API builds offers directly for speed; the declared (schema) fields must agree."""
    from rest_framework import serializers

    from marketplace.api.offers import OfferSerializer

    serializer = OfferSerializer()
    for offer in Offer.objects.all():
        by_fields = serializers.ModelSerializer.to_representation(serializer, offer)
        assert serializer.to_representation(offer) == by_fields
        assert list(serializer.to_representation(offer)) == list(by_fields)


def test_a_page_of_search_rows_is_what_the_serializer_gives(market):
    """The API's search reads rows, not model instances; each must come out as the offer
    serializer writes the same offer."""
    from django.utils import timezone

    from marketplace import offer_query
    from marketplace.api.offers import OfferSerializer, offer_json, search_offer_rows

    serializer = OfferSerializer()
    now = timezone.now()
    rows = search_offer_rows(offer_query.parse("rentable=any -o dph_total"), 64, 0)
    by_id = {offer.pk: offer for offer in Offer.objects.all()}
    assert sorted(row["id"] for row in rows) == sorted(by_id)
    for row in rows:
        expected = serializer.to_representation(by_id[row["id"]])
        got = offer_json(row, now)
        duration, expected_duration = got.pop("duration"), expected.pop("duration")
        assert (duration is None) == (expected_duration is None)
        assert duration is None or abs(duration - expected_duration) < 0.01
        assert got == expected


def test_the_api_writes_an_offer_in_this_exact_shape(api, market):
    """Pins the JSON of one offer, field by field and in order: clients parse it (money as
    decimal strings, figures for the bundle's GPUs, nulls where there is nothing)."""
    quad = market["quad"]
    response = api.get("/api/v1/offers/", {"q": "num_gpus=4 geolocation=US", "limit": 1})
    assert response.status_code == 200
    body = response.json()
    assert list(body) == ["offers", "next_offset"] and body["next_offset"] is None
    (offer,) = body["offers"]
    assert 2.99 <= offer["duration"] <= 3.0  # days until the end date
    expected = {
        "id": quad.pk, "machine_id": quad.machine_id, "host_id": quad.provider_team_id,
        "gpu_name": "RTX 4090", "num_gpus": 4, "total_gpus": 4, "min_gpus": 1, "gpu_ram": 23.99,
        "gpu_total_ram": 95.96, "cpu_cores": 32, "cpu_cores_effective": 32.0, "cpu_ram": 128.0, "disk_space": 2000.0,
        "disk_enforced": False, "dph_total": "3.200000", "dph_per_gpu": "0.800000",
        "storage_cost": "0.100000", "reliability": 0.99, "duration": offer["duration"],
        "end_date": quad.end_date.isoformat().replace("+00:00", "Z"), "geolocation": "US",
        "driver_version": "550.54.14", "cuda_max_good": 12.4, "verified": False,
        "rentable": True, "rented": False, "datacenter": False, "static_ip": True,
        "direct_port_count": 1000, "score": 29.3886, "sharing": False, "gpu_frac": 0.0,
        "slice_core_percent": 0, "slice_memory_mb": 0, "min_slice_core_percent": 0,
        "cards": [], "min_bid": None, "total_flops": 0.0, "compute_cap": 0, "gpu_mem_bw": 0.0,
        "dlperf": 0.0, "dlperf_per_dphtotal": 0.0, "inet_up": 0.0, "inet_down": 0.0,
        "disk_bw": 0.0, "bench_simulated": False,
    }  # fmt: skip
    assert offer == expected
    assert list(offer) == list(expected)


def test_console_page_far_past_the_market_is_clamped_not_a_500(console, provider):
    """A page whose offset overflows the database's OFFSET is shown as the last page allowed."""
    from marketplace.views.rentals import MAX_OFFER_PAGE

    offer_on(provider, "only")
    response = console.get("/offers/", {"page": "100000000000000000000"})
    assert response.status_code == 200
    text = response.content.decode()
    assert f"No more offers on page {MAX_OFFER_PAGE}" in text and 'id="first-page"' in text
    assert 'id="previous-page"' in text  # a way back from there
