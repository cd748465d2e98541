"""The self-test of a machine, recorded: probe, run a container with known limits, read them back."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from hosts import ssh
from hosts.models import Machine
from hosts.selftest import probe_failed, run_self_test
from hosts.services.events import notify_changed, record_event
from hosts.services.probing import machine_probe


def machine_self_test(*, machine_id: int, labels: dict[str, str] | None = None) -> Machine:
    """Probe, then run a small container with known limits and read them back from inside.

    Checks, each recorded with its detail: the probe; the tenant firewall (set up by the
    probe); the image (pulled if missing); the container starts; the CPU and memory limits
    seen in its cgroup (v1 or v2) and its /dev/shm size match what was asked; an environment
    variable arrives; the GPUs are pinned (free GPUs only: a rented GPU is never handed to
    the test). The container is always removed. Nothing here holds a transaction while SSH
    runs.
    """
    try:
        machine = machine_probe(machine_id=machine_id)
    except (ssh.HostError, ValueError) as error:
        checks = probe_failed(error)
    else:
        checks = run_self_test(machine=machine, labels=labels or {})
    return _record_self_test(machine_id=machine_id, checks=checks)


@transaction.atomic
def _record_self_test(*, machine_id: int, checks: list[dict]) -> Machine:
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    passed = all(check["ok"] for check in checks)
    machine.self_test_at = timezone.now()
    machine.self_test_passed = passed
    machine.self_test_report = checks
    machine.save(update_fields=["self_test_at", "self_test_passed", "self_test_report"])
    failed = [check["name"] for check in checks if not check["ok"]]
    record_event(
        machine,
        "self_test",
        "Self-test passed: " + ", ".join(c["name"] for c in checks)
        if passed
        else f"Self-test failed: {', '.join(failed)}",
    )
    notify_changed(machine, "self_test")
    return machine
