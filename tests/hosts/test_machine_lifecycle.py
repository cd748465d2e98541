"""A provider's machine on a simulated host: add, confirm key, probe, list, watch it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from hosts import services, ssh
from hosts.keys import team_public_key
from hosts.models import Machine, MachineEvent, MachineStatus
from marketplace.models import Offer
from tests.factories import TeamFactory

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def add_and_confirm(team, host) -> Machine:
    host.authorize(team_public_key(team.pk))
    machine = services.machine_register(
        team_id=team.pk,
        name=host.spec.name,
        address=host.address,
        port=host.port,
        ssh_user=host.user,
    )
    machine = services.machine_fetch_host_key(machine_id=machine.pk)
    assert machine.status == MachineStatus.AWAITING_CONFIRMATION
    assert machine.offered_key_fingerprint == host.host_key_fingerprint  # what the provider checks
    return services.machine_confirm_host_key(
        machine_id=machine.pk, fingerprint=host.host_key_fingerprint
    )


def test_add_confirm_probe_list(team, sim_host_factory):
    host = sim_host_factory(gpus=4, gpu_name="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    machine = add_and_confirm(team, host)
    machine = services.machine_probe(machine_id=machine.pk)
    assert machine.status == MachineStatus.ONLINE
    gpus = list(machine.gpus.order_by("index").values_list("uuid", "name", "memory_mib"))
    assert gpus == [(g.uuid, g.name, g.memory_mib) for g in host.spec.gpus]
    assert machine.cpu_cores == os.cpu_count()
    assert machine.ram_mb > 1024 and machine.disk_free_gb > 0
    assert machine.cuda_version == "12.4" and machine.driver_version == "550.54.14"
    # Docker and the OS as the machine itself reports them (asked here without our code).
    server = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert machine.docker_version == server
    pretty = re.search(r'^PRETTY_NAME="?([^"\n]*)', Path("/etc/os-release").read_text(), re.M)
    assert machine.os_name == pretty.group(1)
    assert machine.nvidia_runtime is False  # this Docker has no NVIDIA runtime registered
    assert machine.unit_disk_gb == machine.disk_free_gb // 4
    # Units: an even share of the machine per GPU.
    assert machine.unit_cpus == round(os.cpu_count() / 4, 2)
    assert machine.unit_memory_mb == machine.ram_mb // 4
    services.machine_set_terms(
        machine_id=machine.pk, price_per_gpu_hour=1_200_000, storage_price_per_gb_month=100_000,
        min_gpus=1, end_date=None, location="US",
    )  # fmt: skip
    services.machine_set_listed(machine_id=machine.pk, listed=True)
    offer = Offer.objects.get(machine=machine, all_free=True)
    assert offer.rentable and offer.num_gpus == 4 and offer.gpu_name == "A100-SXM4-80GB"


def test_wrong_fingerprint_is_not_pinned(team, sim_host_factory):
    host = sim_host_factory(gpus=1)
    machine = services.machine_register(
        team_id=team.pk, name="x", address=host.address, port=host.port, ssh_user="root"
    )
    services.machine_fetch_host_key(machine_id=machine.pk)
    with pytest.raises(ValidationError) as caught:
        services.machine_confirm_host_key(machine_id=machine.pk, fingerprint="SHA256:somethingelse")
    assert "fingerprint" in caught.value.message_dict
    machine.refresh_from_db()
    assert machine.host_key == "" and machine.status == MachineStatus.AWAITING_CONFIRMATION


def test_another_team_cannot_connect_a_machine_that_authorized_only_the_owners_key(
    team, sim_host_factory
):
    """One platform key for everyone would let any team list (and be paid for) any machine
    that authorized it. Each team has its own key, so naming someone else's address gets a
    record the platform can never log in with, and never locks the owner out."""
    host = sim_host_factory(gpus=2)
    intruder = TeamFactory(name="Intruder")
    theirs = services.machine_register(
        team_id=intruder.pk, name="not mine", address=host.address, port=host.port,
        ssh_user="root",
    )  # fmt: skip
    # The host key is public (any SSH client sees it), so the intruder can even pin it...
    services.machine_fetch_host_key(machine_id=theirs.pk)
    services.machine_confirm_host_key(machine_id=theirs.pk, fingerprint=host.host_key_fingerprint)
    log_before = (host.root / "sshd.log").read_text()
    with pytest.raises(ssh.HostUnreachable):
        services.machine_probe(machine_id=theirs.pk)
    # ...but the machine refuses its key: nothing runs, nothing is read, nothing is offered.
    theirs.refresh_from_db()
    assert theirs.status == MachineStatus.ERROR
    assert f"refused the platform's key for team {intruder.pk}" in theirs.status_detail
    assert "Accepted publickey" not in (host.root / "sshd.log").read_text()[len(log_before) :]
    assert not theirs.gpus.exists()
    assert not Offer.objects.filter(machine=theirs, rentable=True).exists()

    # The owner (who authorized only their own team's key) registers the same address after.
    mine = services.machine_probe(machine_id=add_and_confirm(team, host).pk)
    assert mine.status == MachineStatus.ONLINE and mine.gpu_count == 2
    with pytest.raises(ValidationError, match="already registered this address"):
        services.machine_register(
            team_id=team.pk, name="again", address=host.address, port=host.port, ssh_user="root"
        )
    assert Machine.objects.filter(team=team).count() == 1


def test_a_host_is_connected_once_even_when_it_lets_two_teams_in(team, sim_host_factory):
    """Its owner authorized a second team's key too: listed twice, its GPUs could be rented
    twice. The machine probed first keeps the host; the other is told why and never listed."""
    host = sim_host_factory(gpus=2)
    first = services.machine_probe(machine_id=add_and_confirm(team, host).pk)
    assert first.status == MachineStatus.ONLINE
    second_team = TeamFactory(name="Owner's company")
    second = services.machine_probe(machine_id=add_and_confirm(second_team, host).pk)
    assert second.status == MachineStatus.ERROR
    assert "already connected to the marketplace by another team" in second.status_detail
    with pytest.raises(ValidationError):
        services.machine_set_listed(machine_id=second.pk, listed=True)
    assert not Offer.objects.filter(machine=second, rentable=True).exists()
    first = services.machine_probe(machine_id=first.pk)  # the first keeps working
    assert first.status == MachineStatus.ONLINE and not first.probe_problems


def test_a_changed_host_key_is_refused_before_any_command_runs(team, sim_host_factory):
    host = sim_host_factory(gpus=1)
    machine = add_and_confirm(team, host)
    services.machine_probe(machine_id=machine.pk)
    ssh.pool.forget(machine.pk)
    log_before = (host.root / "sshd.log").read_text()
    host.rotate_host_key()
    with pytest.raises(ssh.HostKeyMismatch):
        ssh.run(machine, ["touch", str(host.root / "should-not-exist")])
    assert not (host.root / "should-not-exist").exists()
    assert "Accepted publickey" not in (host.root / "sshd.log").read_text()[len(log_before) :]
    services.machine_heartbeat(machine_id=machine.pk)
    machine.refresh_from_db()
    assert machine.status == MachineStatus.KEY_MISMATCH


def test_stopped_sshd_goes_offline_after_the_allowed_misses_and_back(
    team, sim_host_factory, settings
):
    settings.HOST_HEARTBEAT_MISSES = 2
    host = sim_host_factory(gpus=1)
    machine = add_and_confirm(team, host)
    services.machine_probe(machine_id=machine.pk)
    host.stop()
    try:
        services.machine_heartbeat(machine_id=machine.pk)
        assert (
            Machine.objects.get(pk=machine.pk).status == MachineStatus.ONLINE
        )  # one miss is allowed
        services.machine_heartbeat(machine_id=machine.pk)
        machine.refresh_from_db()
        assert machine.status == MachineStatus.OFFLINE
        assert not Offer.objects.get(machine=machine, all_free=True).rentable
    finally:
        host.start()
    services.machine_heartbeat(machine_id=machine.pk)
    machine.refresh_from_db()
    assert machine.status == MachineStatus.ONLINE
    assert machine.reliability == pytest.approx(1 / 3, abs=0.01)  # 1 of 3 heartbeats answered
    assert MachineEvent.objects.filter(
        machine=machine, kind="status", message__contains="offline → online"
    ).exists()


def test_a_gpu_that_disappears_is_flagged(team, sim_host_factory):
    host = sim_host_factory(gpus=2)
    machine = add_and_confirm(team, host)
    services.machine_probe(machine_id=machine.pk)
    host.set_gpus((host.spec.gpus[0],))
    try:
        services.machine_probe(machine_id=machine.pk)
        gone = machine.gpus.get(uuid=host.spec.gpus[1].uuid)
        assert gone.present is False
        assert machine.gpu_count == 1
        assert MachineEvent.objects.filter(machine=machine, kind="gpu_missing").exists()
    finally:
        host.set_gpus(host.spec.gpus)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("address", "-oProxyCommand=x"),
        ("address", "a b"),
        ("port", 0),
        ("ssh_user", "root;id"),
        ("ssh_user", "-x"),
    ],
)
def test_register_rejects_bad_input_naming_the_field(team, field, value):
    values = {
        "team_id": team.pk,
        "name": "m",
        "address": "gpu.example.com",
        "port": 22,
        "ssh_user": "root",
    }
    values[field] = value
    with pytest.raises(ValidationError) as caught:
        services.machine_register(**values)
    assert field in caught.value.message_dict
    assert Machine.objects.count() == 0


def test_terms_are_validated(team, sim_host_factory):
    host = sim_host_factory(gpus=1)
    machine = add_and_confirm(team, host)
    services.machine_probe(machine_id=machine.pk)
    with pytest.raises(ValidationError) as caught:
        services.machine_set_terms(
            machine_id=machine.pk, price_per_gpu_hour=-1, storage_price_per_gb_month=10**15,
            min_gpus=5, end_date=None, location="US",
        )  # fmt: skip
    assert set(caught.value.message_dict) == {
        "price_per_gpu_hour",
        "storage_price_per_gb_month",
        "min_gpus",
    }
    assert Machine.objects.get(pk=machine.pk).price_per_gpu_hour == 0


@pytest.fixture
def demo_images(settings, docker_engine):
    """The images `make run` has: the self-test's and the stand-in GPU benchmark's."""
    from hosts.devtools.sim_docker import ensure_gpu_bench_image

    settings.HOST_SELFTEST_IMAGE = docker_engine
    settings.HOST_GPU_BENCH_IMAGE = ensure_gpu_bench_image()
    settings.HOST_BENCH_DISK_MB = 8
    settings.HOST_BENCH_TRANSFER_MB = 1


def test_demo_step_lists_the_simulated_hosts_and_can_run_again(sim_host_factory, db, demo_images):
    from hosts.demo import demo_step
    from tests.factories import UserFactory

    host = sim_host_factory(gpus=2, gpu_name="NVIDIA GeForce RTX 3090", memory_mib=24576)
    provider = UserFactory(username="provider")
    message = demo_step({"provider": provider}, [host.to_dict()])
    assert message == f"demo machines listed: {host.spec.name}"
    machine = Machine.objects.get(address=host.address, port=host.port)
    assert machine.team.memberships.filter(user=provider).exists()
    assert machine.listed and machine.price_per_gpu_hour == 230_000 and machine.gpu_count == 2
    # Verified by a self-test and a benchmark, its GPU figures the model's typical ones.
    assert machine.verified and machine.bench_gpu_simulated and machine.tflops_per_gpu == 35.6
    assert demo_step({"provider": provider}, [host.to_dict()]) == message  # idempotent
    assert Machine.objects.filter(address=host.address).count() == 1


def test_demo_step_waits_for_a_host_whose_first_probes_fail(sim_host_factory, db, demo_images):
    """`make run` on a busy machine: a simulated host's first probes fail (here its driver
    does not answer for a while). The demo probes again until the machine is online and lists
    it, instead of stopping at a machine in error that cannot be listed."""
    import threading

    from hosts.demo import demo_step
    from tests.factories import UserFactory

    host = sim_host_factory(gpus=1)
    host.set_driver_failed(True)
    answers_later = threading.Timer(3, host.set_driver_failed, args=(False,))
    answers_later.start()
    try:
        message = demo_step({"provider": UserFactory(username="provider")}, [host.to_dict()])
    finally:
        answers_later.cancel()
        host.set_driver_failed(False)
    assert message == f"demo machines listed: {host.spec.name}"
    machine = Machine.objects.get(address=host.address, port=host.port)
    assert machine.status == MachineStatus.ONLINE and machine.listed


def test_demo_step_names_a_host_that_never_comes_online(
    sim_host_factory, db, monkeypatch, demo_images
):
    """Past the deadline the demo says which machine is not ready and why, lists the others,
    and the command goes on (make run still starts)."""
    from hosts import demo
    from tests.factories import UserFactory

    monkeypatch.setattr(demo, "ONLINE_WITHIN_SECONDS", 2.0)
    broken, fine = sim_host_factory(gpus=1), sim_host_factory(gpus=1)
    broken.set_driver_failed(True)
    try:
        message = demo.demo_step(
            {"provider": UserFactory(username="provider")}, [broken.to_dict(), fine.to_dict()]
        )
    finally:
        broken.set_driver_failed(False)
    assert f"demo machines listed: {fine.spec.name}" in message
    assert f"demo machines not ready: {broken.spec.name}: not online after 2 s" in message
    assert not Machine.objects.get(address=broken.address, port=broken.port).listed
