"""Placing in batches: the beat sweep places the queued replicas of many deployments at once
(one snapshot of the fleet, one ``rentals_create``), and each replica is still a rental like
any other: its own GPUs, its own hold, checked under the machines' locks.

Machines here exist in the tables only (nothing launches: the launches queued on commit
never run in these tests), so what is checked is the placing itself.
"""

from __future__ import annotations

import itertools

import pytest
from django.utils import timezone

from billing.credits import credit_grant
from billing.models import Hold
from billing.selectors import team_balance
from hosts.models import Gpu, Machine
from marketplace.deployments.placing import Fleet
from marketplace.deployments.reconciler import deployments_reconcile
from marketplace.deployments.services import DeploymentSpec, deployment_create
from marketplace.deployments.sweep import deployments_sweep
from marketplace.models import Rental, Replica
from marketplace.services.offers import offer_refresh
from marketplace.services.pricing import rental_quote
from scheduler.models import GpuAllocation, Instance
from tests.billing.ledger_checks import assert_ledger_consistent
from tests.factories import TeamFactory
from tests.marketplace.conftest import fund

pytestmark = pytest.mark.django_db

numbers = itertools.count()


def paper_machine(provider, *, price: int = 500_000, gpus: int = 2) -> Machine:
    """A listed machine as the tables know it; no host answers at its address (TEST-NET)."""
    n = next(numbers)
    machine = Machine.objects.create(
        team=provider, name=f"paper-{n}", address=f"192.0.2.{n % 250 + 1}", port=22 + n,
        ssh_user="root", host_key_type="ssh-ed25519", host_key="AAAA", status="online",
        listed=True, price_per_gpu_hour=price, storage_price_per_gb_month=100_000, min_gpus=1,
        location="US", cpu_cores=16, ram_mb=65536, disk_free_gb=500, docker_version="24.0",
        driver_version="550.54", cuda_version="12.4", port_range_start=40000,
        port_range_end=40099, reliability=1.0, last_heartbeat_at=timezone.now(),
    )  # fmt: skip
    Gpu.objects.bulk_create(
        Gpu(machine=machine, index=i, uuid=f"GPU-paper-{n}-{i}", name="NVIDIA GeForce RTX 4090",
            memory_mib=24564)
        for i in range(gpus)
    )  # fmt: skip
    offer_refresh(machine_id=machine.pk)
    return machine


def spec(name: str, replicas: int) -> DeploymentSpec:
    return DeploymentSpec(
        name=name, image="gpumkt/busybox:latest", entrypoint="sh", args=["-c", "sleep 1d"],
        gpu_names=["RTX 4090"], replica_count=replicas, duration_hours=1.0,
    )  # fmt: skip


def placed(deployment) -> list[Replica]:
    return list(deployment.replicas.filter(state="placed").select_related("instance__rental"))


def test_one_sweep_places_many_deployments_over_scarce_gpus_without_a_gpu_twice():
    provider = TeamFactory(name="Paper Host")
    teams = [TeamFactory(name=f"Renter {n}") for n in range(3)]
    for team in teams:
        fund(team, 100)
    # Nothing is listed yet: every replica queues.
    deployments = [deployment_create(team=t, spec=spec(f"d{n}", 3)) for n, t in enumerate(teams)]
    assert not Replica.objects.exclude(state="queued").exists()

    machines = [paper_machine(provider) for _ in range(3)]  # 6 GPUs for 9 replicas
    assert deployments_sweep() == 3

    placements = [r for d in deployments for r in placed(d)]
    assert len(placements) == 6
    gpu_ids = list(GpuAllocation.objects.filter(released_at=None).values_list("gpu_id", flat=True))
    assert len(gpu_ids) == len(set(gpu_ids)) == 6
    for deployment in deployments:
        deployment.refresh_from_db()
        mine = placed(deployment)
        # Spread: a deployment's replicas are on different machines.
        assert len({r.instance.machine_id for r in mine}) == len(mine)
        # Each replica is a rental of its team, with its own hold for an hour of one GPU.
        quote = rental_quote(machine=machines[0], gpu_count=1, disk_gb=50, hours=1.0).total
        holds = Hold.objects.filter(pk__in=[r.instance.rental.hold_id for r in mine])
        assert [h.amount for h in holds] == [quote] * len(mine)
        assert {h.team_id for h in holds} <= {deployment.team_id}
        assert team_balance(deployment.team_id).held == quote * len(mine)
        if len(mine) < 3:
            assert deployment.queue_reason == (
                "no RTX 4090 with 1 free GPU; 3 machines have RTX 4090 but only 0 free"
            )
    assert_ledger_consistent()


def test_a_team_short_of_credit_gets_what_it_can_pay_and_says_why():
    provider = TeamFactory(name="Paper Host")
    machine = paper_machine(provider, gpus=4)
    quote = rental_quote(machine=machine, gpu_count=1, disk_gb=50, hours=1.0).total
    team = TeamFactory(name="Thrifty")
    credit_grant(team_id=team.pk, amount=quote + quote // 2, reason="t", idempotency_key="t")

    deployment = deployment_create(team=team, spec=spec("thrifty", 2))

    assert len(placed(deployment)) == 1
    deployment.refresh_from_db()
    assert deployment.queue_reason.startswith("not enough credit to place a replica")
    # The refused replica wrote nothing: one instance, one rental, one hold.
    assert Instance.objects.filter(team=team).count() == 1
    assert Rental.objects.filter(team=team).count() == 1
    assert team_balance(team.pk).held == quote
    assert team_balance(team.pk).available == quote // 2
    assert_ledger_consistent()


def test_a_machine_that_refuses_under_its_lock_is_left_for_the_next_one():
    team = TeamFactory(name="Patient")
    fund(team, 100)
    deployment = deployment_create(team=team, spec=spec("patient", 1))
    assert placed(deployment) == []  # nothing listed yet

    provider = TeamFactory(name="Paper Host")
    cheap = paper_machine(provider, price=100_000)
    dear = paper_machine(provider, price=900_000)
    fleet = Fleet.whole()
    assert fleet.planner is not None  # reads the snapshot: both free, the cheap one first
    # The cheap machine is unlisted after the snapshot was read (its offer not yet refreshed):
    # renting it is refused under its lock, and the replica goes to the next machine.
    Machine.objects.filter(pk=cheap.pk).update(listed=False)

    assert deployments_reconcile([deployment.pk], fleet=fleet) == 1

    [replica] = placed(deployment)
    assert replica.instance.machine_id == dear.pk
    assert not Instance.objects.filter(machine=cheap).exists()
    assert_ledger_consistent()


def sharing_paper_machine(provider, *, gpus: int = 2, price: int = 500_000) -> Machine:
    machine = paper_machine(provider, gpus=gpus, price=price)
    Machine.objects.filter(pk=machine.pk).update(mps_available=True, sharing_enabled=True)
    offer_refresh(machine_id=machine.pk)
    return machine


def slice_spec(name: str, replicas: int, core: int, memory: int, **fields) -> DeploymentSpec:
    return DeploymentSpec(
        name=name, image="gpumkt/busybox:latest", entrypoint="sh", args=["-c", "sleep 1d"],
        gpu_names=["RTX 4090"], replica_count=replicas, duration_hours=1.0, disk_gb=5,
        slice_core_percent=core, slice_memory_mb=memory, **fields,
    )  # fmt: skip


def test_a_deployment_of_slices_packs_cards_and_queues_with_the_reason_when_they_are_full():
    from scheduler.models import GpuSlice

    provider = TeamFactory(name="Sharing Host")
    whole_only = paper_machine(provider, gpus=2)  # does not share: never takes a slice
    machines = [sharing_paper_machine(provider, gpus=2) for _ in range(2)]
    team = TeamFactory(name="Inference")
    fund(team, 100)
    deployment = deployment_create(
        team=team, spec=slice_spec("quarters", 10, 25, 4000, policy="binpack")
    )
    mine = placed(deployment)
    assert len(mine) == 10
    slices = GpuSlice.objects.filter(instance__team=team, released_at=None)
    per_card: dict[int, int] = {}
    for row in slices:
        per_card[row.gpu_id] = per_card.get(row.gpu_id, 0) + row.core_percent
    # Binpack at both tiers: two cards full, a third half, the whole-only machine untouched.
    assert sorted(per_card.values()) == [50, 100, 100]
    assert {r.instance.machine_id for r in mine} <= {m.pk for m in machines}
    assert not GpuAllocation.objects.filter(gpu__machine=whole_only, released_at=None).exists()
    # Each replica is a rental at the card's rate × 25 %.
    assert {r.instance.rental.price_per_gpu_hour for r in mine} == {125_000}

    more = deployment_create(team=team, spec=slice_spec("more", 3, 60, 4000, card_policy="spread"))
    [big] = placed(more)  # only the last whole card has 60 % free
    assert big.instance.gpu_slices.get().gpu_id not in per_card
    more.refresh_from_db()
    assert more.queue_reason == (
        "no RTX 4090 sharing a card with 60% and 4000 MB free; 3 machines have RTX 4090 "
        "but at most 50% and 20564 MB free on one card"
    )
    assert_ledger_consistent()


def test_a_slice_deployment_is_refused_by_name_for_bad_sizes():
    from django.core.exceptions import ValidationError

    team = TeamFactory()
    for bad, field in (
        (slice_spec("x", 1, 0, 100), "gpu_share"),
        (slice_spec("x", 1, 25, 100, gpus_per_replica=2), "gpus_per_replica"),
        (slice_spec("x", 1, 25, 100, card_policy="tightest"), "card_policy"),
    ):
        with pytest.raises(ValidationError) as refused:
            deployment_create(team=team, spec=bad)
        assert field in refused.value.message_dict
    assert not Replica.objects.exists()
