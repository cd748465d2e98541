"""The self-test: probe, then prove on the machine itself that a container gets its limits.

A small container (``settings.HOST_SELFTEST_IMAGE``) runs with a known CPU, memory and shm
limit, an environment variable and the free GPUs pinned; the limits are read back from inside
(cgroup v2 ``cpu.max``/``memory.max``, or v1 ``cpu.cfs_quota_us``/``memory.limit_in_bytes``,
and ``df /dev/shm``). Each check is a dict ``{"name", "ok", "detail"}`` for the page and API.
"""

from __future__ import annotations

import contextlib
import secrets

from django.conf import settings

from hosts import ssh
from hosts.models import Machine, MachineStatus
from hosts.probe import (
    CGROUP_V1_FILES,
    CGROUP_V2_FILES,
    CgroupLimits,
    ProbeError,
    parse_cgroup_v1,
    parse_cgroup_v2,
    parse_df_size_kb,
)
from hosts.runtime import ContainerSpec, DockerHost, InvalidContainerSpec
from hosts.selectors import rented_gpu_ids

TEST_CPUS = 0.5
TEST_MEMORY_MB = 128
TEST_SHM_MB = 32
TEST_ENV = "GPUMKT_SELF_TEST"


def _check(name: str, ok: bool, detail: str) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail[:300]}


def probe_failed(error: Exception) -> list[dict]:
    """The report of a self-test whose probe failed: nothing else was tried."""
    return [_check("probe", False, str(error))]


def run_self_test(*, machine: Machine, labels: dict[str, str]) -> list[dict]:
    """The checks, on a machine just probed: ``hosts.services.machine_self_test`` probes
    first and hands the result here, so this module needs no service (the dependency runs one
    way, services → selftest)."""
    checks: list[dict] = []
    probed = machine.status == MachineStatus.ONLINE
    checks.append(
        _check(
            "probe",
            probed,
            f"{machine.gpu_count} GPU(s), {machine.cpu_cores} cores, "
            f"{machine.ram_mb // 1024} GB RAM, {machine.disk_free_gb} GB free, "
            f"Docker {machine.docker_version or '?'}"
            + ("" if probed else f"; {machine.status_detail}"),
        )
    )
    if not probed:
        return checks
    # Set up by the probe just made: whether rentals here are kept off the host's services
    # and the metadata address (hosts.runtime.firewall).
    checks.append(
        _check(
            "tenant firewall",
            machine.tenant_firewall is True,
            machine.tenant_firewall_detail or "not checked",
        )
    )
    rented = rented_gpu_ids([machine.pk])
    free_gpus = [g.uuid for g in machine.gpus.filter(present=True) if g.pk not in rented]
    token = secrets.token_hex(4)
    try:
        spec = ContainerSpec(
            name=f"gpumkt-selftest-{machine.pk}-{token}",
            image=settings.HOST_SELFTEST_IMAGE,
            cpus=TEST_CPUS,
            memory_mb=TEST_MEMORY_MB,
            shm_mb=TEST_SHM_MB,
            labels={"gpumkt.selftest": "1", **labels},
            env={TEST_ENV: token},
            gpu_uuids=free_gpus,
            entrypoint="sleep",
            args=["300"],
        )
    except InvalidContainerSpec as error:
        return [*checks, _check("container", False, f"bad test container: {error}")]
    host = DockerHost(machine)
    container = ""
    try:
        if host.image_present(spec.image):
            checks.append(_check("image", True, f"{spec.image} is on the machine"))
        else:
            try:
                host.pull(spec.image)
            except ssh.CommandFailed as error:
                return [*checks, _check("image", False, f"could not pull {spec.image}: {error}")]
            checks.append(_check("image", True, f"{spec.image} pulled"))
        container = host.run(spec)
        checks.append(_check("container", True, f"started {container[:12]}"))
        checks += _limit_checks(host, container)
        checks.append(_env_check(host, container, token))
        checks.append(_gpu_check(host, container, machine, free_gpus))
    except ssh.HostError as error:
        checks.append(_check("container", False, str(error)))
    finally:
        # Never started, or the machine went away: nothing we can reach to clean up.
        with contextlib.suppress(ssh.HostError):
            host.remove(container or spec.name)
    return checks


def _limit_checks(host: DockerHost, container: str) -> list[dict]:
    limits: CgroupLimits | None = None
    version = ""
    try:
        v2 = host.exec(container, ["cat", *CGROUP_V2_FILES])
        if v2.exit_code == 0:
            limits, version = parse_cgroup_v2(v2.stdout), "cgroup v2"
        else:
            v1 = host.exec(container, ["cat", *CGROUP_V1_FILES])
            if v1.exit_code == 0:
                limits, version = parse_cgroup_v1(v1.stdout), "cgroup v1"
    except ProbeError as error:
        return [_check("cpu limit", False, str(error)), _check("memory limit", False, str(error))]
    if limits is None:
        missing = "no cgroup v1 or v2 limit files inside the container"
        return [_check("cpu limit", False, missing), _check("memory limit", False, missing)]
    want_memory = TEST_MEMORY_MB * 1024 * 1024
    checks = [
        _check(
            "cpu limit",
            limits.cpus is not None and abs(limits.cpus - TEST_CPUS) < 0.01,
            f"{version}: asked {TEST_CPUS:g} CPUs, the container has "
            + (f"{limits.cpus:g}" if limits.cpus is not None else "no limit"),
        ),
        _check(
            "memory limit",
            limits.memory_bytes == want_memory,
            f"{version}: asked {TEST_MEMORY_MB} MB, the container has "
            + (
                f"{limits.memory_bytes // (1024 * 1024)} MB"
                if limits.memory_bytes is not None
                else "no limit"
            ),
        ),
    ]
    shm = host.exec(container, ["df", "-k", "/dev/shm"])  # noqa: S108 (inside the container)
    try:
        shm_mb = parse_df_size_kb(shm.stdout) // 1024 if shm.exit_code == 0 else None
    except ProbeError:
        shm_mb = None
    checks.append(
        _check(
            "shm size",
            shm_mb == TEST_SHM_MB,
            f"asked {TEST_SHM_MB} MB, /dev/shm is "
            + (f"{shm_mb} MB" if shm_mb is not None else f"unreadable: {shm.stderr.strip()[:80]}"),
        )
    )
    return checks


def _env_check(host: DockerHost, container: str, token: str) -> dict:
    result = host.exec(container, ["env"])
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    arrived = seen.get(TEST_ENV) == token
    return _check(
        "environment", arrived, "the variable arrived" if arrived else "the variable is missing"
    )


def _gpu_check(host: DockerHost, container: str, machine: Machine, free_gpus: list[str]) -> dict:
    if not free_gpus:
        return _check("gpu pinning", True, "no free GPU to test with (all rented); skipped")
    inspected = host.inspect(container)
    if machine.nvidia_runtime:
        requests = inspected.get("HostConfig", {}).get("DeviceRequests") or []
        pinned = [device for request in requests for device in request.get("DeviceIDs") or []]
        how = "--gpus"
    else:
        env = dict(
            item.split("=", 1)
            for item in inspected.get("Config", {}).get("Env") or []
            if "=" in item
        )
        pinned = [u for u in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]
        how = "NVIDIA_VISIBLE_DEVICES (no NVIDIA runtime)"
    ok = sorted(pinned) == sorted(free_gpus)
    return _check(
        "gpu pinning",
        ok,
        f"{len(pinned)} of {len(free_gpus)} free GPU(s) pinned by UUID via {how}",
    )
