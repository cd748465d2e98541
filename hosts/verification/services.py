"""Verification, recorded: a self-test and a benchmark decide whether a machine is verified;
runs repeat on a schedule, after a re-probe that changed the hardware, and the verified mark
is lost when reliability falls below the threshold. Operators revoke or restore it by hand.

Every change of the mark is an event of the machine with its reason, and the reason stays on
the machine (``verification_detail``) for its page and the API. SSH happens outside any
transaction; the record is one short transaction that re-reads the row.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from hosts import ssh
from hosts.benchmark import BenchmarkResult, run_benchmark
from hosts.models import BenchmarkRun, Machine, MachineStatus
from hosts.services.events import notify_changed, record_event
from hosts.services.selftest import machine_self_test
from hosts.verification.marks import (
    AUTO,
    REVOKED,
    apply_verdict,
    min_reliability,
    min_share_of_typical,
    verify_every,
    verify_retry,
)
from hosts.verification.rules import verdict

logger = logging.getLogger(__name__)

# A claimed run may take this long before the schedule offers the machine again.
RUN_LEASE = timedelta(hours=1)


def machine_verify(*, machine_id: int, labels: dict[str, str] | None = None) -> Machine:
    """Self-test (which probes first), then benchmark, then decide and record.

    The benchmark runs only after a passing self-test: a machine that cannot run a container
    with its limits has nothing worth measuring. A machine that could not be reached keeps its
    mark: heartbeats judge reachability, and reliability takes it away if it stays away.
    """
    machine = machine_self_test(machine_id=machine_id, labels=labels)
    checks = machine.self_test_report or []
    if checks and checks[0]["name"] == "probe" and not checks[0]["ok"] and _unreachable(machine):
        return _reschedule(machine_id=machine_id, after=verify_retry())
    failures = [check["name"] for check in checks if not check["ok"]]
    bench = None
    if not failures:
        try:
            bench = run_benchmark(machine=machine, labels=labels or {})
        except ssh.HostError as error:
            bench = BenchmarkResult()
            bench.step("benchmark", False, str(error))
    return machine_verification_record(
        machine_id=machine_id, self_test_failures=failures, bench=bench
    )


def _unreachable(machine: Machine) -> bool:
    return machine.status in (MachineStatus.OFFLINE, MachineStatus.KEY_MISMATCH)


@transaction.atomic
def _reschedule(*, machine_id: int, after: timedelta) -> Machine:
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    machine.verification_due_at = timezone.now() + after
    machine.save(update_fields=["verification_due_at"])
    return machine


@transaction.atomic
def machine_verification_record(
    *, machine_id: int, self_test_failures: list[str] | None, bench: BenchmarkResult | None
) -> Machine:
    """Store the benchmark (its figures on the machine when it passed) and apply the verdict."""
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    now = timezone.now()
    if bench is not None:
        _store_benchmark(machine, bench, now)
    decided = verdict(
        self_test_failures=self_test_failures,
        bench=bench,
        reliability=machine.reliability,
        min_reliability=min_reliability(),
        min_share_of_typical=min_share_of_typical(),
    )
    if bench is not None:
        record_event(
            machine,
            "benchmark",
            (
                "Benchmark passed"
                if bench.passed
                else "Benchmark failed: " + "; ".join(bench.failures)
            )
            + (" (GPU figures simulated)" if bench.gpu_simulated else ""),
        )
    machine.verification_due_at = now + (verify_every() if decided.verified else verify_retry())
    machine.save(update_fields=["verification_due_at"])
    apply_verdict(machine, decided, now)
    notify_changed(machine, "verification")
    return machine


def _store_benchmark(machine: Machine, bench: BenchmarkResult, now) -> None:
    run = BenchmarkRun.objects.create(
        machine=machine,
        measured_at=now,
        passed=bench.passed,
        reason="; ".join(bench.failures)[:500],
        gpu_simulated=bench.gpu_simulated,
        gpu_count=len(bench.gpus),
        compute_cap=max((gpu.compute_cap for gpu in bench.gpus), default=0),
        tflops_per_gpu=bench.per_gpu("fp32_tflops"),
        fp16_tflops_per_gpu=bench.per_gpu("fp16_tflops"),
        gpu_mem_bw=bench.per_gpu("mem_bw"),
        disk_write_mbps=bench.disk_write_mbps,
        disk_read_mbps=bench.disk_read_mbps,
        inet_up=bench.inet_up,
        inet_down=bench.inet_down,
        docker_start_ms=bench.docker_start_ms,
        dlperf_per_gpu=bench.dlperf_per_gpu,
        steps=bench.steps,
    )
    if not bench.passed:
        return  # the figures offered stay the last good run's; the mark says the rest
    machine.bench_at = now
    machine.bench_gpu_simulated = run.gpu_simulated
    for name in ("inet_up", "inet_down", "disk_write_mbps", "disk_read_mbps", "docker_start_ms"):
        setattr(machine, name, getattr(run, name) or 0)
    if run.gpu_count:  # all GPUs rented: the GPU figures stay the last measured ones
        machine.compute_cap = run.compute_cap
        machine.tflops_per_gpu = run.tflops_per_gpu or 0
        machine.gpu_mem_bw = run.gpu_mem_bw or 0
        machine.dlperf_per_gpu = run.dlperf_per_gpu or 0
    machine.save()


@transaction.atomic
def machine_verification_set_by_operator(
    *, machine_id: int, verified: bool, reason: str, operator: str
) -> Machine:
    """An operator revokes the mark (it stays off until restored, whatever runs find) or
    restores it (runs judge the machine again from then on). ``reason`` is required: it is
    what the provider reads on the machine's page."""
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("reason: say why, for the provider and the events")
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    now = timezone.now()
    what = "restored" if verified else "revoked"
    message = f"Verification {what} by operator {operator}: {reason}"
    machine.verification_override = AUTO if verified else REVOKED
    machine.verified = verified
    machine.verification_detail = message[:500]
    machine.verified_changed_at = now
    machine.save(
        update_fields=["verification_override", "verified", "verification_detail",
                       "verified_changed_at"]
    )  # fmt: skip
    record_event(machine, "verification", message)
    notify_changed(machine, "verification")
    return machine


def machines_due_verification(*, limit: int = 100) -> list[int]:
    """Claim machines due a run (online, never run or their time has come), moving their due
    time a lease ahead with a conditional update, so two schedulers never queue one twice."""
    now = timezone.now()
    due = Q(verification_due_at__isnull=True) | Q(verification_due_at__lte=now)
    candidates = list(
        Machine.objects.filter(due, status=MachineStatus.ONLINE)
        .exclude(host_key="")
        .order_by("verification_due_at", "pk")
        .values_list("pk", "verification_due_at")[:limit]
    )
    claimed = []
    for machine_id, was in candidates:
        if Machine.objects.filter(pk=machine_id, verification_due_at=was).update(
            verification_due_at=now + RUN_LEASE
        ):
            claimed.append(machine_id)
    return claimed
