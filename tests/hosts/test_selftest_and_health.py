"""Self-test, key changes met by any room, pool reconnects, heartbeat fan-out, charts."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from hosts import services, ssh, tasks
from hosts.models import HeartbeatSample, Machine, MachineEvent, MachineStatus
from hosts.runtime import DockerHost
from hosts.signals import machine_host_key_mismatch, machine_status_changed
from tests.conftest import client_for, sim_container_label
from tests.hosts.support import add_and_confirm, containers, online_machine

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_self_test_runs_a_container_and_reads_its_limits_back(
    team, sim_host, docker_engine, settings
):
    settings.HOST_SELFTEST_IMAGE = docker_engine
    machine = online_machine(team, sim_host)
    key, value = sim_container_label().split("=", 1)
    machine = services.machine_self_test(machine_id=machine.pk, labels={key: value})
    report = {check["name"]: check for check in machine.self_test_report}
    assert machine.self_test_passed is True, machine.self_test_report
    assert list(report) == [
        "probe", "tenant firewall", "image", "container", "cpu limit", "memory limit",
        "shm size", "environment", "gpu pinning",
    ]  # fmt: skip
    assert "asked 0.5 CPUs, the container has 0.5" in report["cpu limit"]["detail"]
    assert "asked 128 MB, the container has 128 MB" in report["memory limit"]["detail"]
    assert report["gpu pinning"]["detail"].startswith("4 of 4 free GPU(s) pinned")
    assert report["tenant firewall"]["detail"].startswith("Rentals cannot reach the host")
    assert MachineEvent.objects.filter(machine=machine, kind="self_test").exists()
    assert report["image"]["detail"] == f"{docker_engine} is on the machine"
    # The test container is always removed.
    assert containers("label=gpumkt.selftest=1", f"label=gpumkt.machine={machine.pk}") == []


def test_self_test_of_an_unreachable_machine_fails_on_the_probe(team, sim_host_factory):
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    host.stop()
    try:
        ssh.pool.forget(machine.pk)
        machine = services.machine_self_test(machine_id=machine.pk)
    finally:
        host.start()
    assert machine.self_test_passed is False
    assert [c["name"] for c in machine.self_test_report] == ["probe"]
    assert machine.self_test_report[0]["ok"] is False


def test_self_test_reports_an_image_it_cannot_pull(team, sim_host, settings):
    settings.HOST_SELFTEST_IMAGE = "gpumkt/no-such-selftest-image:1"
    machine = services.machine_self_test(machine_id=online_machine(team, sim_host).pk)
    failed = [c for c in machine.self_test_report if not c["ok"]]
    assert machine.self_test_passed is False
    assert [c["name"] for c in failed] == ["image"]
    assert "could not pull gpumkt/no-such-selftest-image:1" in failed[0]["detail"]


def test_self_test_button_shows_the_report(client, team, owner, sim_host, docker_engine, settings):
    settings.HOST_SELFTEST_IMAGE = docker_engine
    machine = online_machine(team, sim_host)
    client_for(client, owner, team)
    response = client.post(f"/machines/{machine.pk}/self-test/", follow=True)
    page = response.content.decode()
    assert 'id="self-test-result"' in page and "passed" in page
    assert "asked 128 MB, the container has 128 MB" in page


def test_a_changed_key_met_by_the_runtime_flags_the_machine_and_can_be_pinned_again(
    team, sim_host_factory
):
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    ssh.pool.forget(machine.pk)
    old_fingerprint = host.host_key_fingerprint
    host.rotate_host_key()
    heard = []

    def on_mismatch(sender, **kwargs):
        heard.append(kwargs)

    machine_host_key_mismatch.connect(on_mismatch)
    try:
        with pytest.raises(ssh.HostKeyMismatch):
            DockerHost(machine).list_platform_containers()  # any room, any command
    finally:
        machine_host_key_mismatch.disconnect(on_mismatch)
    machine.refresh_from_db()
    assert machine.status == MachineStatus.KEY_MISMATCH
    assert machine.host_key_fingerprint == old_fingerprint  # still pinned: nothing runs
    assert machine.offered_key_fingerprint == host.host_key_fingerprint
    assert heard and heard[0]["presented"] == host.host_key_fingerprint
    with pytest.raises(ssh.HostKeyMismatch):
        ssh.run(machine, ["true"])
    # The provider checks the new fingerprint on the machine and pins it.
    services.machine_confirm_host_key(machine_id=machine.pk, fingerprint=host.host_key_fingerprint)
    machine = services.machine_probe(machine_id=machine.pk)
    assert machine.status == MachineStatus.ONLINE
    assert machine.host_key_fingerprint == host.host_key_fingerprint
    assert MachineEvent.objects.filter(
        machine=machine, kind="key_pinned", message__contains="was " + old_fingerprint
    ).exists()


def test_a_machine_without_a_pinned_key_gets_no_command(team, sim_host):
    machine = services.machine_register(
        team_id=team.pk, name="new", address=sim_host.address, port=sim_host.port, ssh_user="root"
    )
    with pytest.raises(ssh.HostKeyMismatch):
        ssh.run(machine, ["true"])
    machine.refresh_from_db()
    assert machine.status == MachineStatus.PENDING  # nothing presented, nothing flagged


def test_the_pool_reuses_its_connection_and_reconnects_after_an_outage(team, sim_host_factory):
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    first = ssh.pool.connection(machine)
    assert ssh.pool.connection(machine) is first
    host.stop()
    host.start()
    assert ssh.run(machine, ["echo", "back"]).stdout == "back\n"  # reconnected by itself
    assert ssh.pool.connection(machine) is not first


def test_heartbeats_fan_out_to_watched_machines_and_record_samples(team, sim_host_factory):
    machine = online_machine(team, sim_host_factory(gpus=2))
    pending = services.machine_register(
        team_id=team.pk, name="pending", address="192.0.2.1", port=22, ssh_user="root"
    )
    assert tasks.heartbeats() == 1  # eager in tests: the heartbeat itself ran too
    sample = HeartbeatSample.objects.get(machine=machine)
    assert sample.ok and sample.gpus_total == 2 and sample.gpus_rented == 0
    assert not HeartbeatSample.objects.filter(machine=pending).exists()
    assert Machine.objects.get(pk=machine.pk).last_heartbeat_at is not None


def test_status_changes_are_signalled_once_after_commit(team, sim_host_factory, settings):
    settings.HOST_HEARTBEAT_MISSES = 1
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    heard = []

    def on_status(sender, **kwargs):
        heard.append((kwargs["old"], kwargs["new"]))

    machine_status_changed.connect(on_status)
    try:
        host.stop()
        try:
            services.machine_heartbeat(machine_id=machine.pk)
            services.machine_heartbeat(machine_id=machine.pk)  # already offline: no repeat
        finally:
            host.start()
        services.machine_heartbeat(machine_id=machine.pk)
    finally:
        machine_status_changed.disconnect(on_status)
    assert heard == [("online", "offline"), ("offline", "online")]


def test_machine_page_draws_uptime_and_utilization_charts(client, team, owner, sim_host):
    machine = online_machine(team, sim_host)
    for _ in range(3):
        services.machine_heartbeat(machine_id=machine.pk)
    client_for(client, owner, team)
    page = client.get(f"/machines/{machine.pk}/").content.decode()
    # Utilization, heartbeats answered, and the reliability recorded (once: hourly).
    assert page.count('<svg class="chart"') == 3
    assert "100% answered (3 heartbeats, 4 GPUs)" in page
    assert "0% rented (3 heartbeats, 4 GPUs)" in page
    assert page.count('aria-label="Reliability recorded each hour') == 1
    assert "the share of rented GPU time over the last 7 days" in page


def test_machines_page_queries_do_not_grow_with_machines(client, team, owner, sim_host_factory):
    client_for(client, owner, team)
    online_machine(team, sim_host_factory(gpus=1), name="a")
    with CaptureQueriesContext(connection) as one:
        client.get("/machines/")
    online_machine(team, sim_host_factory(gpus=1), name="b")
    online_machine(team, sim_host_factory(gpus=1), name="c")
    with CaptureQueriesContext(connection) as three:
        assert client.get("/machines/").status_code == 200
    assert len(three) == len(one)


def test_unpinned_key_is_not_confirmable_with_another_fingerprint(team, sim_host):
    machine = add_and_confirm(team, sim_host)
    with pytest.raises(services.ValidationError):
        services.machine_confirm_host_key(machine_id=machine.pk, fingerprint="SHA256:other")
