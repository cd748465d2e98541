"""The offer query language: what a renter types, and the errors they get."""

from __future__ import annotations

import pytest

from marketplace.offer_query import QueryError, parse, parse_json


def test_the_documented_example_parses():
    query = parse(
        "num_gpus>=2 gpu_name=RTX_4090 reliability>0.98 dph_total<1.5 geolocation in [US,CA] -o dph_total"
    )
    assert query.filters == {
        "num_gpus": (">=", 2),
        "gpu_name": ("=", "RTX 4090"),
        "reliability": (">", 0.98),
        "dph_total": ("<", 1_500_000),
        "geolocation": ("in", ["US", "CA"]),
    }
    assert query.order == [("dph_total", False)]


def test_trailing_dash_sorts_descending_and_several_fields_sort_in_order():
    assert parse("-o reliability-,dph_total").order == [("reliability", True), ("dph_total", False)]


def test_any_drops_a_default_filter():
    assert parse("").effective_filters() == {"rentable": ("=", True)}
    assert parse("rentable=any").effective_filters() == {}


def test_notin_and_spaces_around_operators():
    query = parse("geolocation notin [EU, AS]  num_gpus >= 4")
    assert query.filters["geolocation"] == ("notin", ["EU", "AS"])
    assert query.filters["num_gpus"] == (">=", 4)


@pytest.mark.parametrize(
    ("text", "position", "reason"),
    [
        ("num_gpus>=2 gpu_nmae=RTX", 12, "unknown field 'gpu_nmae'"),
        ("num_gpus>=two", 0, "needs a number"),
        ("num_gpus>=2.5", 0, "whole number"),
        ("dph_total<nan", 0, "out of range"),
        ("dph_total<1e400", 0, "out of range"),
        ("gpu_name>RTX", 0, "does not apply"),
        ("geolocation in US", 0, "needs a list"),
        ("geolocation in []", 0, "empty"),
        ("verified=maybe", 0, "true or false"),
        ("num_gpus>=", 0, "has no value"),
        ("; rm -rf /", 0, "expected a term"),
        ("num_gpus>=2 -o price", 15, "unknown field 'price'"),
    ],
)
def test_bad_queries_point_at_the_token_and_say_why(text, position, reason):
    with pytest.raises(QueryError) as caught:
        parse(text)
    assert caught.value.position == position
    assert reason in str(caught.value)
    assert f"at position {position}" in str(caught.value)


def test_overlong_query_is_refused():
    with pytest.raises(QueryError, match="longer than 2000"):
        parse("num_gpus>=1 " * 300)


def test_json_filters_mean_the_same_as_the_query_language():
    from_json = parse_json(
        {"num_gpus": {"gte": 2}, "gpu_name": {"eq": "RTX 4090"}, "geolocation": {"in": ["US", "CA"]},
         "dph_total": {"lt": 1.5}, "order": [["dph_total", "asc"]]}
    )  # fmt: skip
    from_text = parse(
        "num_gpus>=2 gpu_name=RTX_4090 geolocation in [US,CA] dph_total<1.5 -o dph_total"
    )
    assert from_json.filters == from_text.filters
    assert from_json.order == from_text.order


def test_json_unknown_operator_names_it():
    with pytest.raises(QueryError, match="unknown operator 'approx'"):
        parse_json({"num_gpus": {"approx": 2}})
