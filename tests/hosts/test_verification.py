"""Verified machines: a self-test and a benchmark run on a simulated host, the mark lost with
its reason when a run fails or the GPUs measure well below their model, an operator's revoke
and restore, and reliability as the share of rented time that was runnable."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hosts import services
from hosts.devtools.sim_docker import ensure_gpu_bench_image
from hosts.models import BenchmarkRun, HeartbeatSample, Machine, MachineEvent
from hosts.services import machine_container_killed, reliability_figures
from hosts.verification import services as verification
from marketplace.models import Offer
from tests.conftest import client_for, sim_container_label
from tests.hosts.support import containers, online_machine

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

BROKEN_BENCH = 'echo "CUDA error: no CUDA-capable device is detected" >&2\nexit 3\n'
# Real-format figures (not simulated) a quarter of an RTX 4090's FP32 throughput.
SLOW_BENCH = """\
for uuid in $(echo "$NVIDIA_VISIBLE_DEVICES" | tr ',' ' '); do
  echo "{\\"uuid\\": \\"$uuid\\", \\"compute_cap\\": \\"8.9\\", \\"fp32_tflops\\": 20.5, \\"fp16_tflops\\": 160.0, \\"mem_bw\\": 990.0, \\"simulated\\": false}"
done
"""


@pytest.fixture
def bench_settings(settings, docker_engine):
    settings.HOST_SELFTEST_IMAGE = docker_engine
    settings.HOST_GPU_BENCH_IMAGE = ensure_gpu_bench_image()
    settings.HOST_BENCH_DISK_MB = 8
    settings.HOST_BENCH_TRANSFER_MB = 1
    return settings


def labels() -> dict[str, str]:
    key, value = sim_container_label().split("=", 1)
    return {key: value}


def verification_events(machine) -> list[str]:
    return list(
        MachineEvent.objects.filter(machine=machine, kind="verification")
        .order_by("created_at", "pk")
        .values_list("message", flat=True)
    )


def test_a_machine_is_verified_loses_it_to_a_failing_benchmark_and_gets_it_back(
    client, team, owner, sim_host_factory, bench_settings
):
    machine = online_machine(team, sim_host_factory(gpus=2))
    assert machine.verified is False

    machine = verification.machine_verify(machine_id=machine.pk, labels=labels())
    assert machine.verified is True, machine.verification_detail
    assert machine.verification_detail == "self-test and benchmark passed (GPU figures simulated)"
    run = BenchmarkRun.objects.get(machine=machine)
    assert run.passed and run.gpu_simulated and run.gpu_count == 2
    # Simulated GPUs: the RTX 4090's typical figures, marked so; the rest measured.
    assert (run.tflops_per_gpu, run.gpu_mem_bw, run.compute_cap) == (82.6, 1008.0, 890)
    assert run.disk_write_mbps > 0 and run.disk_read_mbps > 0
    assert run.inet_up > 0 and run.inet_down > 0 and run.docker_start_ms > 0
    assert run.measured_at == machine.bench_at
    offer = Offer.objects.get(machine=machine, all_free=True)
    assert offer.verified is True and offer.bench_simulated is True
    assert offer.dlperf == pytest.approx(machine.dlperf_per_gpu * 2)
    assert offer.total_flops == pytest.approx(165.2)
    assert offer.inet_down == machine.inet_down > 0

    bench_settings.HOST_GPU_BENCH_IMAGE = ensure_gpu_bench_image(
        "gpumkt/gpu-bench-broken:latest", BROKEN_BENCH
    )
    machine = verification.machine_verify(machine_id=machine.pk, labels=labels())
    assert machine.verified is False
    assert machine.verification_detail.startswith("benchmark failed: gpu: ")
    assert "exited 3: CUDA error: no CUDA-capable device is detected" in (
        machine.verification_detail
    )
    failed = BenchmarkRun.objects.filter(machine=machine).first()
    assert failed.passed is False and failed.tflops_per_gpu is None
    # The figures offered stay the last passing run's; the mark goes.
    assert machine.tflops_per_gpu == 82.6
    assert Offer.objects.get(machine=machine, all_free=True).verified is False

    bench_settings.HOST_GPU_BENCH_IMAGE = ensure_gpu_bench_image()
    machine = verification.machine_verify(machine_id=machine.pk, labels=labels())
    assert machine.verified is True
    events = verification_events(machine)
    assert (
        events[0]
        == events[2]
        == ("Verified: self-test and benchmark passed (GPU figures simulated)")
    )
    assert events[1] == f"No longer verified: benchmark failed: {failed.reason}"
    assert len(events) == 3
    assert BenchmarkRun.objects.filter(machine=machine).count() == 3
    assert containers("label=gpumkt.benchmark=1", f"label=gpumkt.machine={machine.pk}") == []
    # The machine's page: the reason, the figures marked simulated, a bar per run (one bad).
    client_for(client, owner, team)
    page = client.get(f"/machines/{machine.pk}/").content.decode()
    assert 'id="verification-reason">self-test and benchmark passed (GPU figures simulated)' in (
        page
    )
    assert "GPU figures simulated" in page and 'aria-label="dlperf per GPU' in page
    assert page.count('class="bar-bad"><title>') == 1


def test_gpus_measured_well_below_their_model_lose_the_mark(team, sim_host_factory, bench_settings):
    machine = online_machine(team, sim_host_factory(gpus=1))
    bench_settings.HOST_GPU_BENCH_IMAGE = ensure_gpu_bench_image(
        "gpumkt/gpu-bench-slow:latest", SLOW_BENCH
    )
    machine = verification.machine_verify(machine_id=machine.pk, labels=labels())
    assert machine.verified is False
    assert "measured 20.5 FP32 TFLOPS, 25% of the 82.6 typical of NVIDIA GeForce RTX 4090" in (
        machine.verification_detail
    )
    run = BenchmarkRun.objects.get(machine=machine)
    assert run.passed is True and run.gpu_simulated is False  # measured, and slow
    assert machine.tflops_per_gpu == 20.5


def test_an_operator_revokes_and_restores_with_a_reason(team, sim_host_factory, bench_settings):
    machine = online_machine(team, sim_host_factory(gpus=1))
    machine = verification.machine_verify(machine_id=machine.pk, labels=labels())
    assert machine.verified is True
    with pytest.raises(ValueError, match="reason"):
        verification.machine_verification_set_by_operator(
            machine_id=machine.pk, verified=False, reason=" ", operator="ops"
        )
    machine.refresh_from_db()
    assert machine.verified is True and len(verification_events(machine)) == 1

    verification.machine_verification_set_by_operator(
        machine_id=machine.pk, verified=False, reason="GPUs resold elsewhere", operator="ops"
    )
    # A passing run does not undo an operator's revocation.
    machine = verification.machine_verify(machine_id=machine.pk, labels=labels())
    assert machine.verified is False
    assert machine.verification_detail == (
        "Verification revoked by operator ops: GPUs resold elsewhere"
    )
    machine = verification.machine_verification_set_by_operator(
        machine_id=machine.pk, verified=True, reason="checked on site", operator="ops"
    )
    assert machine.verified is True
    assert verification_events(machine)[-2:] == [
        "Verification revoked by operator ops: GPUs resold elsewhere",
        "Verification restored by operator ops: checked on site",
    ]
    assert Offer.objects.get(machine=machine, all_free=True).verified is True


@pytest.mark.django_db
def test_reliability_is_the_share_of_rented_time_that_was_runnable(team, settings):
    settings.HOST_HEARTBEAT_SECONDS = 30
    machine = Machine.objects.create(team=team, name="m", address="203.0.113.7")
    now = timezone.now()

    def sample(ok: bool, rented: int, ago: int) -> None:
        made = HeartbeatSample.objects.create(
            machine=machine, ok=ok, gpus_rented=rented, gpus_total=4
        )
        HeartbeatSample.objects.filter(pk=made.pk).update(created_at=now - timedelta(minutes=ago))

    # Idle: judged by heartbeats alone.
    sample(False, 0, 50)
    sample(True, 0, 49)
    assert reliability_figures(machine, now=now) == (0.5, 0, 0)
    # Rented: 2 GPUs for 3 heartbeats, one missed → two thirds runnable; the idle miss
    # no longer counts.
    sample(True, 2, 3)
    sample(False, 2, 2)
    sample(True, 2, 1)
    assert reliability_figures(machine, now=now) == (round(4 / 6, 4), 180, 120)
    # A container the host killed costs an hour of runnable time (here all there was).
    machine_container_killed(machine_id=machine.pk, container="c0ffee", reason="it vanished")
    assert reliability_figures(machine, now=timezone.now()) == (0.0, 180, 0)
    assert MachineEvent.objects.filter(machine=machine, kind="container_killed").count() == 1


def test_a_reprobe_that_finds_other_hardware_makes_verification_due_again(
    team, sim_host_factory, bench_settings
):
    host = sim_host_factory(gpus=2)
    machine = verification.machine_verify(machine_id=online_machine(team, host).pk, labels=labels())
    assert machine.verified and machine.verification_due_at > timezone.now()
    assert machine.pk not in verification.machines_due_verification()
    host.set_gpus(host.spec.gpus[:1])  # a GPU fell off the bus
    services.machine_probe(machine_id=machine.pk)
    machine.refresh_from_db()
    assert machine.verification_due_at <= timezone.now()
    assert MachineEvent.objects.filter(machine=machine, kind="hardware_changed").exists()
    assert verification.machines_due_verification() == [machine.pk]
    assert verification.machines_due_verification() == []  # claimed once


def test_reliability_below_the_threshold_takes_the_mark_away_at_the_next_heartbeat(
    team, sim_host_factory, bench_settings
):
    bench_settings.HOST_VERIFY_MIN_RELIABILITY = 0.95
    machine = verification.machine_verify(
        machine_id=online_machine(team, sim_host_factory(gpus=1)).pk, labels=labels()
    )
    assert machine.verified
    # A rented GPU whose machine missed half its heartbeats lately.
    HeartbeatSample.objects.bulk_create(
        HeartbeatSample(machine=machine, ok=i % 2 == 0, gpus_rented=1, gpus_total=1)
        for i in range(10)
    )
    machine = services.machine_heartbeat(machine_id=machine.pk)
    assert machine.verified is False
    # 5 of the 10 rented heartbeats runnable (the one just answered found nothing rented).
    assert machine.verification_detail == "reliability 50.0% fell below the required 95%"
    assert verification_events(machine)[-1] == (
        "No longer verified: reliability 50.0% fell below the required 95%"
    )
    assert Offer.objects.get(machine=machine, all_free=True).verified is False
