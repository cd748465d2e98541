"""``insert_models`` writes the same rows whichever way it takes on PostgreSQL: one in an
INSERT … VALUES … RETURNING, more by binary COPY with ids taken first (core/pg_bulk.py). Each
instance gets the id of its own row, and every kind of value (a UUID, JSON, a choice, a date,
a null) is stored as the ORM would store it.

``upsert_models`` inserts new rows and updates those already there, a few in one INSERT …
VALUES, more through the connection's kept staging table: an upsert never writes another's
staged rows, and the staging table holds nothing once a transaction has ended."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core import pg_bulk
from hosts.models import Machine
from marketplace.models import Offer
from scheduler.models import Instance, InstanceState, LaunchMode
from tests.factories import TeamFactory

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        settings.DATABASES["default"]["ENGINE"] != "core.postgresql",
        reason="the statements under test are PostgreSQL's",
    ),
]

FIELDS = ["uuid", "team_id", "machine_id", "state", "launch_mode", "gpu_count", "image", "args",
          "env", "slice_core_percent", "slice_memory_mb", "label", "work_due_at", "volumes"]  # fmt: skip


def instances(count: int) -> list[Instance]:
    team = TeamFactory(name="Renters")
    machine = Machine.objects.create(team=TeamFactory(name="Host"), name="m", address="10.1.2.3")
    due = timezone.now()
    return [
        Instance(
            team=team, machine=machine, gpu_count=1 + n % 2 * 3, image=f"gpumkt/app:{n}",
            state=InstanceState.STOPPED if n % 2 else InstanceState.LAUNCHING,
            launch_mode=LaunchMode.SSH if n % 3 else LaunchMode.ENTRYPOINT,
            args=["--step", str(n), "it's \"quoted\"; rm -rf /"], env={"N": str(n), "EMPTY": ""},
            # Odd: 4 whole GPUs; even: a slice of one (both slice columns, or neither).
            slice_core_percent=None if n % 2 else 50, slice_memory_mb=None if n % 2 else 1024 + n,
            label=f"run {n} ✓",
            work_due_at=due + timedelta(seconds=n), volumes=[],
        )
        for n in range(count)
    ]  # fmt: skip


@pytest.mark.parametrize("count", [1, 2, 20], ids=["one: VALUES", "two: COPY", "many: COPY"])
def test_inserted_rows_hold_each_instances_values_under_its_own_id(count):
    written = instances(count)

    pg_bulk.insert_models(Instance, written)

    assert len({instance.pk for instance in written}) == count
    stored = {row["id"]: row for row in Instance.objects.values("id", *FIELDS)}
    assert sorted(stored) == sorted(instance.pk for instance in written)
    for instance in written:
        assert stored[instance.pk] == {
            "id": instance.pk,
            **{f: getattr(instance, f) for f in FIELDS},
        }
    # The instances are rows now: saving one again updates it, it does not insert another.
    written[0].label = "renamed"
    written[0].save(update_fields=["label"])
    assert Instance.objects.get(pk=written[0].pk).label == "renamed"
    assert Instance.objects.count() == count


def test_nothing_to_insert_writes_nothing():
    pg_bulk.insert_models(Instance, [])
    assert not Instance.objects.exists()


UPDATED = [
    "all_free", "rentable", "gpu_name", "total_gpus", "gpu_ram", "cpu_cores_per_unit",
    "cpu_ram_per_unit", "disk_per_unit", "price_per_gpu_hour", "dph_total", "storage_cost",
    "reliability", "end_date",
]  # fmt: skip


def offers(machines: list[Machine], sizes: list[int], price: int) -> list[Offer]:
    """Unsaved bundles of each machine, every one at ``price`` micro-dollars a GPU-hour."""
    return [
        Offer(
            machine=machine, provider_team=machine.team, rentable=True, gpu_name="RTX 4090",
            num_gpus=size, total_gpus=8, gpu_ram=24, cpu_cores_per_unit=4, cpu_ram_per_unit=32,
            disk_per_unit=100, price_per_gpu_hour=price, dph_total=price * size,
            storage_cost=100_000, reliability=0.99, end_date=timezone.now() + timedelta(days=30),
        )
        for machine in machines
        for size in sizes
    ]  # fmt: skip


def host_machines(count: int) -> list[Machine]:
    team = TeamFactory(name="Host")
    return [
        Machine.objects.create(team=team, name=f"m{n}", address=f"10.1.2.{n + 1}")
        for n in range(count)
    ]


def upsert(rows: list[Offer]) -> list[Offer]:
    return pg_bulk.upsert_models(
        Offer, rows, unique_fields=["machine", "num_gpus"], update_fields=UPDATED
    )


def staged_rows() -> int:
    """Rows in this connection's staging table for offers (0 when it was never made)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('pg_temp.upsert_marketplace_offer') IS NOT NULL")
        if not cursor.fetchone()[0]:
            return 0
        cursor.execute("SELECT count(*) FROM pg_temp.upsert_marketplace_offer")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("machines", [1, 5], ids=["few: VALUES", "many: staged"])
def test_upserted_rows_are_inserted_or_updated_each_under_its_own_id(machines):
    hosts = host_machines(machines)
    there = offers(hosts, [1, 2], price=200_000)
    Offer.objects.bulk_create(there)

    written = upsert(offers(hosts, [1, 2, 4, 8], price=300_000))

    stored = {(o.machine_id, o.num_gpus): o for o in Offer.objects.all()}
    assert len(stored) == machines * 4
    for offer in written:
        row = stored[(offer.machine_id, offer.num_gpus)]
        assert offer.pk == row.pk
        assert (row.price_per_gpu_hour, row.dph_total) == (300_000, 300_000 * offer.num_gpus)
    # The bundles that were there kept their rows (updated, not inserted again).
    assert {o.pk for o in there} <= {o.pk for o in written}


def test_an_upsert_never_writes_the_rows_an_earlier_one_staged_in_the_same_transaction():
    first, second = host_machines(2)
    with transaction.atomic():
        upsert(offers([first], [1, 2, 3, 4, 5, 6, 7, 8], price=200_000))
        Offer.objects.filter(machine=first).update(price_per_gpu_hour=999_000)
        upsert(offers([second], [1, 2, 3, 4, 5, 6, 7, 8], price=300_000))

    assert set(
        Offer.objects.filter(machine=first).values_list("price_per_gpu_hour", flat=True)
    ) == {999_000}
    assert Offer.objects.filter(machine=second).count() == 8


@pytest.mark.django_db(transaction=True)
def test_the_staging_table_is_empty_after_each_transaction_committed_or_rolled_back():
    hosts = host_machines(3)
    upsert(offers(hosts, [1, 2, 4, 8], price=200_000))  # its own transaction, committed
    assert staged_rows() == 0

    with pytest.raises(RuntimeError), transaction.atomic():
        upsert(offers(hosts, [1, 2, 4, 8], price=300_000))
        raise RuntimeError("the caller's transaction fails after the upsert")
    assert staged_rows() == 0
    assert set(Offer.objects.values_list("price_per_gpu_hour", flat=True)) == {200_000}

    upsert(offers(hosts, [1, 2, 4, 8], price=400_000))
    assert staged_rows() == 0
    assert set(Offer.objects.values_list("price_per_gpu_hour", flat=True)) == {400_000}
    with connection.cursor() as cursor:  # nothing piles up in a table autovacuum never visits
        cursor.execute("SELECT pg_relation_size('pg_temp.upsert_marketplace_offer')")
        assert cursor.fetchone()[0] == 0
