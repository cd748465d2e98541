"""A machine leaves service only for good reasons and comes back by itself; a changed host key
comes back only when a person pins a key."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hosts import services, ssh, tasks
from hosts.devtools.simulation import SimHostSpec, create_host, default_gpus
from hosts.models import Gpu, HeartbeatSample, Machine, MachineEvent, MachineStatus
from hosts.selectors import gpu_occupancy
from tests.hosts.support import add_and_confirm, online_machine

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def driver_failing():
    """Yields a function that makes a host's nvidia-smi fail; every host is fixed after."""
    broken = []

    def fail(host):
        host.set_driver_failed(True)
        broken.append(host)

    yield fail
    for host in broken:
        host.set_driver_failed(False)


def test_one_failed_nvidia_smi_keeps_the_machine_in_service_with_its_gpus(
    team, sim_host_factory, driver_failing
):
    host = sim_host_factory(gpus=4)
    machine = online_machine(team, host)
    probed_at = machine.probed_at
    driver_failing(host)
    machine = services.machine_probe(machine_id=machine.pk)
    assert machine.status == MachineStatus.ONLINE
    assert machine.gpus.filter(present=True).count() == 4  # nothing is flagged missing
    assert machine.probe_failures == 1 and machine.probed_at == probed_at  # last good figures
    assert "NVIDIA-SMI has failed" in machine.probe_problems[0]
    assert machine.driver_version == "550.54.14"
    assert not MachineEvent.objects.filter(machine=machine, kind="gpu_missing").exists()
    assert MachineEvent.objects.filter(
        machine=machine, kind="probed", message__contains="GPUs unknown"
    ).exists()


def test_repeated_probe_failures_take_it_out_and_a_heartbeat_brings_it_back(
    team, sim_host_factory, driver_failing, settings
):
    settings.HOST_PROBE_FAILURES = 2
    settings.HOST_PROBE_RETRY_SECONDS = 0
    host = sim_host_factory(gpus=2)
    machine = online_machine(team, host)
    driver_failing(host)
    services.machine_probe(machine_id=machine.pk)
    machine = services.machine_probe(machine_id=machine.pk)
    assert machine.status == MachineStatus.ERROR
    assert "2 probes in a row found problems" in machine.status_detail
    # Its GPUs are out of service with it, not gone.
    assert [state for _, state in gpu_occupancy([machine])[machine.pk]] == ["offline"] * 2
    # Heartbeats still cover it, and a heartbeat it answers re-probes it while broken...
    assert tasks.heartbeats() == 1
    assert Machine.objects.get(pk=machine.pk).status == MachineStatus.ERROR
    host.set_driver_failed(False)
    # ...and brings it back once the probe is clean, with nobody pressing a button.
    assert tasks.heartbeat(machine.pk) == MachineStatus.ONLINE
    machine.refresh_from_db()
    assert machine.probe_failures == 0 and machine.probe_problems == []
    assert [state for _, state in gpu_occupancy([machine])[machine.pk]] == ["free"] * 2
    assert MachineEvent.objects.filter(
        machine=machine, kind="status", message__contains="error → online"
    ).exists()


def test_a_machine_whose_setup_probe_failed_recovers_by_itself(
    team, sim_host_factory, driver_failing, settings
):
    settings.HOST_PROBE_RETRY_SECONDS = 0
    host = sim_host_factory(gpus=1)
    driver_failing(host)
    machine = add_and_confirm(team, host)
    # Never probed cleanly: it cannot be listed, it is in error (not in service yet).
    assert tasks.machine_probe(machine.pk) == MachineStatus.ERROR
    machine = Machine.objects.get(pk=machine.pk)
    assert machine.status == MachineStatus.ERROR and machine.gpu_count == 0
    host.set_driver_failed(False)
    tasks.heartbeats()
    machine.refresh_from_db()
    assert machine.status == MachineStatus.ONLINE and machine.gpu_count == 1


def test_the_retry_waits_for_its_interval(team, sim_host_factory, driver_failing, settings):
    settings.HOST_PROBE_RETRY_SECONDS = 300
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    assert not services.machine_probe_due(machine)  # online and healthy: the 6-hourly probe
    driver_failing(host)
    machine = services.machine_probe(machine_id=machine.pk)
    assert not services.machine_probe_due(machine)
    later = machine.probe_attempted_at + timedelta(seconds=301)
    assert services.machine_probe_due(machine, now=later)


def test_an_unreachable_re_probe_is_left_to_the_heartbeats(team, sim_host_factory):
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    host.stop()
    try:
        ssh.pool.forget(machine.pk)
        with pytest.raises(ssh.HostUnreachable):
            services.machine_probe(machine_id=machine.pk)
    finally:
        host.start()
    machine.refresh_from_db()
    assert machine.status == MachineStatus.ONLINE and machine.probe_failures == 0
    assert machine.gpus.filter(present=True).count() == 1
    assert MachineEvent.objects.filter(machine=machine, kind="probe_failed").exists()


def test_reading_the_key_of_an_unreachable_machine_does_not_take_it_out(team, sim_host_factory):
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    host.stop()
    try:
        machine = services.machine_fetch_host_key(machine_id=machine.pk)
    finally:
        host.start()
    assert machine.status == MachineStatus.ONLINE
    assert MachineEvent.objects.filter(machine=machine, kind="key_read").exists()


def test_restarted_simulated_hosts_report_the_same_gpus(team, sim_host_factory):
    host = sim_host_factory(gpus=3)
    machine = online_machine(team, host)
    host.stop()
    # `make run` again: the host is made anew from its name (same root, so the same key).
    again = create_host(
        host.root,
        SimHostSpec(
            name=host.spec.name, address=host.address, port=host.port, gpus=default_gpus(3),
            port_range=host.spec.port_range,
        ),
    )  # fmt: skip
    assert [g.uuid for g in again.spec.gpus] == [g.uuid for g in host.spec.gpus]
    ssh.pool.forget(machine.pk)
    machine = services.machine_probe(machine_id=machine.pk)
    assert Gpu.objects.filter(machine=machine).count() == 3
    assert machine.gpu_count == 3
    assert not MachineEvent.objects.filter(machine=machine, kind="gpu_missing").exists()


def _another_key() -> ssh.RemoteHostKey:
    line = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    kind, blob = line.split()[:2]
    return ssh.RemoteHostKey(kind, blob, ssh.fingerprint(base64.b64decode(blob)))


def test_only_a_person_pinning_a_key_clears_a_key_mismatch(team, sim_host_factory):
    host = sim_host_factory(gpus=1)
    machine = online_machine(team, host)
    pooled = ssh.pool.connection(machine)
    assert pooled.alive
    # Another worker met a different key on its way to this machine (say, a man in the
    # middle on its network path) and flagged it; this worker's connection is still open.
    services.machine_flag_key_mismatch(machine_id=machine.pk, presented=_another_key())
    assert not pooled.alive  # dropped: a flagged machine keeps no connection
    machine.refresh_from_db()
    assert machine.status == MachineStatus.KEY_MISMATCH
    marker = host.root / "ran-while-flagged"
    with pytest.raises(ssh.HostKeyMismatch):
        ssh.run(machine, ["touch", str(marker)])
    assert not marker.exists()
    # The machine itself answers with the pinned key, but heartbeats do not clear the flag.
    machine = services.machine_heartbeat(machine_id=machine.pk)
    assert machine.status == MachineStatus.KEY_MISMATCH
    assert HeartbeatSample.objects.filter(machine=machine).latest("created_at").ok is False
    tasks.heartbeats()
    assert Machine.objects.get(pk=machine.pk).status == MachineStatus.KEY_MISMATCH
    # The provider reads the key again: it is the pinned one; they check it and pin it.
    machine = services.machine_fetch_host_key(machine_id=machine.pk)
    assert machine.status == MachineStatus.KEY_MISMATCH
    assert machine.offered_key_fingerprint == host.host_key_fingerprint
    services.machine_confirm_host_key(machine_id=machine.pk, fingerprint=host.host_key_fingerprint)
    machine = services.machine_probe(machine_id=machine.pk)
    assert machine.status == MachineStatus.ONLINE
    assert ssh.run(machine, ["echo", "back"]).stdout == "back\n"


def test_the_key_mismatch_page_offers_to_pin_the_old_key_again(client, team, owner, sim_host):
    from tests.conftest import client_for

    machine = online_machine(team, sim_host)
    services.machine_flag_key_mismatch(machine_id=machine.pk, presented=_another_key())
    services.machine_fetch_host_key(machine_id=machine.pk)  # presents the pinned key again
    client_for(client, owner, team)
    page = client.get(f"/machines/{machine.pk}/").content.decode()
    assert "pin this key again" in page and sim_host.host_key_fingerprint in page
