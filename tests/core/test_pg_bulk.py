"""``insert_models`` writes the same rows whichever way it takes on PostgreSQL: one in an
INSERT … VALUES … RETURNING, more by binary COPY with ids taken first (core/pg_bulk.py). Each
instance gets the id of its own row, and every kind of value (a UUID, JSON, a choice, a date,
a null) is stored as the ORM would store it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from core import pg_bulk
from hosts.models import Machine
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
