"""Reconcilers racing: several passes over the same deployments at once, in threads on their
own PostgreSQL connections and in two worker processes, and a Hypothesis state machine that changes the world at random
(scale, conditions, spec, listing, machines going offline, replicas exiting or failing, hosts
finishing their work) and races two passes after every step. After each step:

- a deployment never has more live replicas than it wants (one more while a replica set rolls
  to a new spec: the surge);
- no GPU is allocated twice, and a placed replica holds exactly its GPUs;
- every placed replica has exactly one rental and one open hold, its instance launching or
  running on an online machine;
- a queued replica holds nothing: the team's open holds are exactly its placed replicas', and
  an ended replica's rental is being destroyed.

The machines are rows only (no host behind them) and launches are not run: the work a rental
queues goes to the broker, where no worker takes it, so the test plays the hosts itself
(``scheduler.services.instance_transition``: a launch finishes, a container exits or fails, a
destroy is confirmed). Everything else is ours, unmocked: rentals through ``rental_create``,
GPUs under the database's constraints, holds in the ledger, the reconciler's row locks.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from billing.models import Hold, HoldStatus
from hosts.models import Gpu, Machine
from hosts.services.events import set_status
from hosts.services.listing import machine_set_listed
from marketplace.celery import app as celery_app
from marketplace.deployments import rolling
from marketplace.deployments.conditions import spec_hash
from marketplace.deployments.reconciler import deployment_reconcile, wanted_live
from marketplace.deployments.services import (
    DeploymentSpec,
    deployment_create,
    deployment_stop,
    deployment_update,
)
from marketplace.models import Deployment, Rental, Replica, Role
from marketplace.models.deployments import LIVE_REPLICA_STATES, PLACED_REPLICA_STATES
from marketplace.services.offers import offer_refresh
from scheduler.models import GpuAllocation, Instance, InstanceState
from scheduler.services import instance_transition
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund

pytestmark = pytest.mark.django_db(transaction=True)

S = InstanceState
names = itertools.count()


@pytest.fixture(autouse=True)
def work_goes_to_the_broker():
    """Launches and destroys (and reconcile wake-ups) are queued on the broker, not run: the
    test plays the hosts and runs the passes itself."""
    celery_app.control.purge()
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = False
    yield
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = True
    celery_app.control.purge()


def renter():
    team = TeamFactory(name=f"Racer {next(names)}")
    add_member(team, UserFactory(username=f"racer-{next(names)}"), Role.OWNER)
    fund(team, 1000)
    return team


def paper_machine(provider, *, price: int, gpus: int = 2, listed: bool = True) -> Machine:
    """A listed machine as the tables know it; no host answers at its address (TEST-NET)."""
    n = next(names)
    machine = Machine.objects.create(
        team=provider, name=f"race-{n}", address=f"192.0.2.{n % 250 + 1}", port=22,
        ssh_user="root", host_key_type="ssh-ed25519", host_key="AAAA", status="online",
        listed=listed, price_per_gpu_hour=price, storage_price_per_gb_month=100_000,
        min_gpus=1, location="US", cpu_cores=16, ram_mb=65536, disk_free_gb=500,
        docker_version="24.0", driver_version="550.54", cuda_version="12.4",
        port_range_start=40000, port_range_end=40099, reliability=1.0,
        last_heartbeat_at=timezone.now(), verified=True,
    )  # fmt: skip
    Gpu.objects.bulk_create(
        [
            Gpu(
                machine=machine,
                index=i,
                uuid=f"GPU-race-{n}-{i}",
                name="NVIDIA GeForce RTX 4090",
                memory_mib=24564,
                present=True,
            )  # fmt: skip
            for i in range(gpus)
        ]
    )
    offer_refresh(machine_id=machine.pk)
    return machine


def spec(name: str, **overrides) -> DeploymentSpec:
    values = {
        "name": name, "image": "gpumkt/busybox:latest", "entrypoint": "sh",
        "args": ["-c", "sleep 1d"], "gpu_names": ["RTX 4090"], "duration_hours": 1.0,
        **overrides,
    }  # fmt: skip
    return DeploymentSpec(**values)


def race(deployment_ids: list[int], threads: int = 2, seed: int = 0) -> list[BaseException]:
    """``threads`` passes over every deployment at once, each thread in its own order and on
    its own connection; returns what they raised."""
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        order = list(deployment_ids)
        random.Random(seed * 100 + n).shuffle(order)
        try:
            barrier.wait(timeout=30)
            for deployment_id in order:
                deployment_reconcile(deployment_id=deployment_id)
        except BaseException as error:  # noqa: BLE001 - reported by the caller
            errors.append(error)
        finally:
            connection.close()

    pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in pool), "a reconcile pass hung"
    return errors


def hosts_catch_up() -> None:
    """What workers on the hosts would do: launches finish, destroys are confirmed."""
    for pk in Instance.objects.filter(state=S.LAUNCHING).values_list("pk", flat=True):
        instance_transition(
            instance_id=pk, to_state=S.RUNNING, reason="Started", only_from={S.LAUNCHING}
        )
    for pk in Instance.objects.filter(state=S.DESTROYING).values_list("pk", flat=True):
        instance_transition(
            instance_id=pk,
            to_state=S.DESTROYED,
            reason="Removed",
            only_from={S.DESTROYING},
            container_stopped=True,
        )


def assert_invariants(teams, deployment_ids: list[int]) -> int:
    """Check them all; returns how many replicas are placed."""
    # No GPU twice (the database refuses it; this says so if that ever changes), and only
    # instances that hold GPUs have any.
    live_allocations = GpuAllocation.objects.filter(released_at=None)
    doubled = live_allocations.values("gpu").annotate(n=Count("pk")).filter(n__gt=1)
    assert not doubled.exists(), list(doubled)
    holding = {S.LAUNCHING, S.RUNNING, S.EXITED, S.UNKNOWN, S.STOPPING, S.DESTROYING}
    stray = live_allocations.exclude(instance__state__in=holding)
    assert not stray.exists(), list(stray.values("instance_id", "instance__state"))

    placed_total = 0
    for deployment in Deployment.objects.filter(pk__in=deployment_ids):
        live = list(
            deployment.replicas.filter(state__in=LIVE_REPLICA_STATES).select_related(
                "instance__machine", "instance__rental"
            )
        )
        # A replica set's replicas on machines that do not answer are kept beside the ones
        # placed for them (surge): they do not count.
        counted = [
            r
            for r in live
            if deployment.mode != "replicaset"
            or r.instance is None
            or r.instance.state != S.UNKNOWN
        ]
        rolling_now = bool(rolling.old_replicas(deployment, counted, spec_hash(deployment)))
        allowed = wanted_live(deployment) + (1 if rolling_now else 0)
        assert len(counted) <= allowed, (deployment.pk, deployment.state, len(counted), allowed)
        for replica in live:
            if replica.state not in PLACED_REPLICA_STATES:
                assert replica.instance_id is None  # queued: no rental, so no hold, no GPU
                continue
            placed_total += 1
            instance = replica.instance
            assert instance.state in (S.LAUNCHING, S.RUNNING, S.UNKNOWN), (
                replica.pk,
                instance.state,
            )
            # A machine out of service leaves its running replicas unknown (kept for the
            # grace), never launching ones (placed again elsewhere) nor "running" ones.
            online = instance.machine.status == "online"
            assert online or instance.state == S.UNKNOWN, (replica.pk, instance.state)
            assert Rental.objects.filter(instance=instance).count() == 1
            hold = Hold.objects.get(pk=instance.rental.hold_id)
            assert hold.status == HoldStatus.OPEN, (replica.pk, hold.status)
            gpus = live_allocations.filter(instance=instance).count()
            assert gpus == deployment.gpus_per_replica, (replica.pk, gpus)
        ended = deployment.replicas.exclude(state__in=LIVE_REPLICA_STATES).exclude(instance=None)
        lingering = ended.exclude(instance__state__in=(S.DESTROYING, S.DESTROYED))
        assert not lingering.exists(), list(lingering.values("pk", "state", "instance__state"))
    open_holds = Hold.objects.filter(team__in=teams, status=HoldStatus.OPEN).count()
    assert open_holds == placed_total, (open_holds, placed_total)
    return placed_total


# --- threads --------------------------------------------------------------------------------


def test_many_threads_reconciling_the_same_deployments_keep_the_invariants(provider_team):
    team = renter()
    machines = [paper_machine(provider_team, price=500_000, listed=False) for _ in range(3)]
    # Queued while nothing is listed: the racing passes are the ones that place.
    ids = [
        deployment_create(team=team, spec=spec(f"d{i}", replica_count=3, policy=policy)).pk
        for i, policy in enumerate(("spread", "binpack", "spread"))
    ]
    assert Replica.objects.filter(state="queued").count() == 9
    for machine in machines:
        with transaction.atomic():
            machine_set_listed(machine_id=machine.pk, listed=True)
        offer_refresh(machine_id=machine.pk)

    for round_ in range(4):
        errors = race(ids, threads=4, seed=round_)
        assert not errors, errors
        assert_invariants([team], ids)
        hosts_catch_up()
        if round_ == 1:  # change the spec of one and shrink another, then race again
            deployment_update(
                deployment=Deployment.objects.get(pk=ids[0]), changes={"env": {"V": "2"}}
            )
            deployment_update(
                deployment=Deployment.objects.get(pk=ids[1]), changes={"replica_count": 1}
            )
    # Nine wanted on six GPUs: all six are used, the rest queue.
    placed = Replica.objects.filter(state__in=PLACED_REPLICA_STATES).count()
    assert placed == 6
    assert GpuAllocation.objects.filter(released_at=None).count() == 6


# --- two worker processes ------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
PASSES = """
import os, sys, time, pathlib
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
django.setup()
from marketplace.deployments.reconciler import deployment_reconcile
go, ids = pathlib.Path(sys.argv[1]), [int(n) for n in sys.argv[2].split(",")]
go.with_name("ready" + sys.argv[3]).touch()
while not go.exists():
    time.sleep(0.005)
for _ in range(3):
    for deployment_id in ids[:: int(sys.argv[3])]:
        deployment_reconcile(deployment_id=deployment_id)
"""


def test_two_worker_processes_reconciling_at_once_keep_the_invariants(provider_team, tmp_path):
    team = renter()
    machines = [paper_machine(provider_team, price=500_000, listed=False) for _ in range(2)]
    ids = [deployment_create(team=team, spec=spec(f"p{i}", replica_count=3)).pk for i in range(3)]
    for machine in machines:
        Machine.objects.filter(pk=machine.pk).update(listed=True)
        offer_refresh(machine_id=machine.pk)
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/"
        f"{db['NAME']}",
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "PYTHONPATH": str(ROOT),
    }
    go = tmp_path / "go"
    csv = ",".join(map(str, ids))
    workers = []
    for step in ("1", "-1"):  # one in order, the other backwards
        with (tmp_path / f"worker{step}.log").open("w") as log:
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-c", PASSES, str(go), csv, step],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready*"))) < 2:  # both have started Django
        assert time.monotonic() < deadline and all(w.poll() is None for w in workers)
        time.sleep(0.05)
    go.touch()
    for step, worker in zip(("1", "-1"), workers, strict=True):
        worker.wait(timeout=120)
        assert worker.returncode == 0, (tmp_path / f"worker{step}.log").read_text()[-3000:]
    assert_invariants([team], ids)
    # Nine wanted on four GPUs: all four are used, the rest queue.
    replicas = Replica.objects.filter(deployment_id__in=ids)
    assert replicas.filter(state__in=PLACED_REPLICA_STATES).count() == 4
    assert replicas.filter(state="queued").count() == 5


# --- a state machine ------------------------------------------------------------------------


class RacingReconcilers(RuleBasedStateMachine):
    def __init__(self, provider, seen: Counter[str]):
        super().__init__()
        self.team = renter()
        # Three 2-GPU machines, one cheap: a price cap moves replicas onto it.
        self.machines = [
            paper_machine(provider, price=price) for price in (500_000, 300_000, 500_000)
        ]
        self.ids = [
            deployment_create(team=self.team, spec=spec("web", replica_count=2)).pk,
            deployment_create(
                team=self.team, spec=spec("batch", replica_count=2, policy="binpack")
            ).pk,
            deployment_create(
                team=self.team,
                spec=spec("job", mode="job", replica_count=2, completions=4, backoff_limit=3),
            ).pk,
        ]
        self.rounds = 0
        self.seen = seen

    def _after(self) -> None:
        self.rounds += 1
        errors = race(self.ids, threads=2, seed=self.rounds)
        assert not errors, errors
        self.seen["placed"] += assert_invariants([self.team], self.ids)
        self.seen["steps"] += 1

    def _active(self, which: int) -> Deployment | None:
        deployment = Deployment.objects.get(pk=self.ids[which])
        return deployment if deployment.state == "active" else None

    @rule(which=st.integers(0, 1), count=st.integers(0, 4))
    def scale(self, which, count):
        if deployment := self._active(which):
            deployment_update(deployment=deployment, changes={"replica_count": count})
        self._after()

    @rule(which=st.integers(0, 1), cap=st.sampled_from([None, 400_000]))
    def change_price_cap(self, which, cap):
        if deployment := self._active(which):
            deployment_update(deployment=deployment, changes={"max_price_per_gpu_hour": cap})
        self._after()

    @rule(which=st.integers(0, 2), version=st.integers(1, 3))
    def change_spec(self, which, version):
        if deployment := self._active(which):
            deployment_update(deployment=deployment, changes={"env": {"V": str(version)}})
        self._after()

    @rule(index=st.integers(0, 2), listed=st.booleans())
    def list_or_unlist(self, index, listed):
        machine = self.machines[index]
        if Machine.objects.get(pk=machine.pk).status == "online":
            with transaction.atomic():
                machine_set_listed(machine_id=machine.pk, listed=listed)
            offer_refresh(machine_id=machine.pk)
        self._after()

    @rule(index=st.integers(0, 2), online=st.booleans())
    def machine_goes(self, index, online):
        with transaction.atomic():
            machine = Machine.objects.select_for_update().get(pk=self.machines[index].pk)
            set_status(machine, "online" if online else "offline", "the test")
        offer_refresh(machine_id=machine.pk)
        self._after()

    @rule(pick=st.integers(0, 50), how=st.sampled_from(["exit 0", "exit 1", "failed"]))
    def a_container_ends(self, pick, how):
        running = list(
            Instance.objects.filter(replica__deployment_id__in=self.ids, state=S.RUNNING)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        if running:
            pk = running[pick % len(running)]
            if how == "failed":
                instance_transition(
                    instance_id=pk, to_state=S.FAILED, reason="vanished",
                    only_from={S.RUNNING}, container_stopped=True,
                )  # fmt: skip
            else:
                instance_transition(
                    instance_id=pk, to_state=S.EXITED, reason=how,
                    only_from={S.RUNNING}, exit_code=int(how[-1]),
                )  # fmt: skip
        self._after()

    @rule()
    def hosts_catch_up(self):
        hosts_catch_up()
        self._after()

    def teardown(self):
        # Out of the next example's way: every deployment stops, its rentals are destroyed
        # and confirmed, and the machines leave the market.
        for pk in self.ids:
            deployment_stop(deployment=Deployment.objects.get(pk=pk))
        hosts_catch_up()
        Machine.objects.filter(pk__in=[m.pk for m in self.machines]).update(
            listed=False, status="offline"
        )
        for machine in self.machines:
            offer_refresh(machine_id=machine.pk)


def test_random_steps_with_two_racing_reconcilers_keep_the_invariants(provider_team):
    seen: Counter[str] = Counter()
    run_state_machine_as_test(
        lambda: RacingReconcilers(provider_team, seen),
        settings=settings(
            max_examples=3,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert seen["steps"] and seen["placed"], seen  # the checks saw placed replicas
