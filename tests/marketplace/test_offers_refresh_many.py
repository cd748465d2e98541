"""A refresh of many machines' offers at once (a batch of placements touches hundreds) writes
what a refresh of each alone would: new bundles inserted, changed ones updated in place (their
ids kept), bundles no longer offered deleted; twice in one transaction too. On PostgreSQL
many rows go through a temporary table and one upsert, a few through one INSERT … VALUES …
ON CONFLICT (core/pg_bulk.upsert_models): both ways are tested."""

from __future__ import annotations

import pytest
from django.db import transaction

from core import pg_bulk
from hosts.models import Machine
from marketplace.models import Offer, Role
from marketplace.services.offers import offers_refresh
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.test_offer_search import offer_on

pytestmark = pytest.mark.django_db


def rows(machine_ids) -> dict[tuple[int, int], tuple[int, int]]:
    """(machine, GPUs) → (offer id, bundle price) as stored."""
    return {
        (o.machine_id, o.num_gpus): (o.pk, o.dph_total)
        for o in Offer.objects.filter(machine_id__in=machine_ids)
    }


@pytest.mark.parametrize("small_upsert", [2, 1000], ids=["temporary table", "one statement"])
def test_many_machines_refreshed_together_insert_update_and_delete_their_bundles(
    small_upsert, monkeypatch
):
    monkeypatch.setattr(pg_bulk, "FEW_ROWS", small_upsert)
    provider = TeamFactory(name="Provider")
    add_member(provider, UserFactory(username="provider"), Role.OWNER)
    eight = offer_on(provider, "eight", gpus=8, price=0.5).machine_id
    four = offer_on(provider, "four", gpus=4, price=1.0).machine_id
    before = rows([eight, four])
    assert sorted(before) == [(eight, 1), (eight, 2), (eight, 4), (eight, 8),
                              (four, 1), (four, 2), (four, 4)]  # fmt: skip

    with transaction.atomic():
        Machine.objects.filter(pk=eight).update(min_gpus=3)  # 1 and 2 no longer offered; 3 is
        Machine.objects.filter(pk=four).update(price_per_gpu_hour=2_000_000)
        first = offers_refresh([eight, four])
        Machine.objects.filter(pk=four).update(price_per_gpu_hour=3_000_000)
        second = offers_refresh([four, eight])  # again, in the same transaction

    after = rows([eight, four])
    assert sorted(after) == [(eight, 3), (eight, 4), (eight, 8),
                             (four, 1), (four, 2), (four, 4)]  # fmt: skip
    # Updated in place: the same ids, the last prices.
    for key in [(eight, 4), (eight, 8), (four, 1), (four, 2), (four, 4)]:
        assert after[key][0] == before[key][0]
    assert {n: after[(four, n)][1] for n in (1, 2, 4)} == {
        1: 3_000_000,
        2: 6_000_000,
        4: 12_000_000,
    }
    assert after[(eight, 3)][1] == 1_500_000
    # What the refresh returns is what was stored, each with its row's id.
    for returned in (first, second):
        assert {(o.machine_id, o.num_gpus): o.pk for o in returned} == {
            key: pk for key, (pk, _) in after.items()
        }
