"""Renting on a simulated host, end to end: real SSH, real Docker, real ledger."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Hold
from billing.selectors import team_balance
from marketplace.models import Offer, Rental
from marketplace.rentals.metering import rental_meter, rental_owed
from marketplace.tasks import expiry_sweep, rental_launch
from scheduler.models import GpuAllocation, Instance, PortAllocation
from tests.conftest import key_client
from tests.marketplace.conftest import containers_named, docker_inspect, fund, machine_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

RENT = {
    "num_gpus": 2,
    "image": "gpumkt/busybox:latest",
    "duration_hours": 3,
    "disk_gb": 10,
    "entrypoint": "sh",
    "args": ["-c", "echo started $FOO; exec sleep 600"],
    "env": {"FOO": 'bar baz; $(whoami) `id` "q"'},
    "ports": [8080],
}


def rent(client, machine, **overrides):
    return client.post(
        "/api/v1/instances/", {**RENT, "machine_id": machine.pk, **overrides}, format="json"
    )


def test_rent_runs_a_container_with_its_units_limits_env_ports_and_gpus(
    funded_team, sim_host_factory, provider_team
):
    machine = machine_for(sim_host_factory(gpus=4), provider_team)
    client = key_client(funded_team)
    response = rent(client, machine)
    assert response.status_code == 201, response.content
    body = client.get(f"/api/v1/instances/{response.json()['id']}/").json()
    assert body["state"] == "running", body["status_message"]
    instance = Instance.objects.get(pk=body["id"])
    container = docker_inspect(instance.container_id)
    host_config = container["HostConfig"]
    assert host_config["NanoCpus"] == round(machine.unit_cpus * 2, 2) * 1e9
    assert host_config["Memory"] == machine.unit_memory_mb * 2 * 1024 * 1024
    assert host_config["ShmSize"] == machine.unit_shm_mb * 2 * 1024 * 1024
    assert not host_config["Privileged"]
    allocated = sorted(
        GpuAllocation.objects.filter(instance=instance, released_at=None).values_list(
            "gpu__uuid", flat=True
        )
    )
    assert len(allocated) == 2 and sorted(body["gpus"]) == allocated
    env = container["Config"]["Env"]
    assert f"FOO={RENT['env']['FOO']}" in env
    assert f"NVIDIA_VISIBLE_DEVICES={','.join(body['gpus'])}" in env
    published = host_config["PortBindings"]["8080/tcp"][0]["HostPort"]
    port = PortAllocation.objects.get(instance=instance, released_at=None)
    assert int(published) == port.host_port
    assert machine.port_range_start <= port.host_port <= machine.port_range_end
    assert body["connection"]["ports"][0]["address"] == f"{machine.address}:{port.host_port}"
    # The renter reads the logs and runs a command.
    logs = client.get(f"/api/v1/instances/{instance.pk}/logs/?tail=20").json()["logs"]
    assert f"started {RENT['env']['FOO']}" in logs
    run = client.post(
        f"/api/v1/instances/{instance.pk}/exec/", {"command": "echo $FOO; nproc"}, format="json"
    ).json()
    assert run["exit_code"] == 0 and RENT["env"]["FOO"] in run["output"]
    # The hold covers 3 hours of 2 GPUs plus storage: $0.50/GPU-h × 2 GPUs × 3 h = 3,000,000 µ$;
    # $0.10/GB-month × 10 GB × 10,800 s / 2,592,000 s = 4,166.7 → 4,167 µ$.
    rental = instance.rental
    hold = Hold.objects.get(pk=rental.hold_id)
    assert hold.amount == 3_004_167
    balance = team_balance(funded_team.pk)
    assert balance.available == 100_000_000 - 3_004_167  # the $100 granted, less the hold
    # Held is what the hold still reserves: storage has run since the rental began, and a slow
    # launch may already have captured a micro-dollar of it.
    assert balance.held == 3_004_167 - hold.captured
    # The offer now shows the two free GPUs left.
    assert Offer.objects.get(machine=machine, all_free=True).num_gpus == 2


def test_stop_start_extend_destroy_and_the_ledger(funded_team, sim_host_factory, provider_team):
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    client = key_client(funded_team)
    instance_id = rent(client, machine, num_gpus=1).json()["id"]
    instance = Instance.objects.get(pk=instance_id)
    first_gpu = GpuAllocation.objects.get(instance=instance, released_at=None).gpu_id
    rental = instance.rental
    # An hour of GPU time has passed (moved clock, so the figures are exact).
    Rental.objects.filter(pk=rental.pk).update(
        gpu_clock_since=timezone.now() - timedelta(hours=1),
        storage_clock_since=timezone.now() - timedelta(hours=1),
    )

    assert client.post(f"/api/v1/instances/{instance_id}/stop/").status_code == 202
    instance.refresh_from_db()
    assert instance.state == "stopped"
    assert docker_inspect(instance.container_id)["State"]["Running"] is False
    assert not GpuAllocation.objects.filter(instance=instance, released_at=None).exists()
    assert Offer.objects.get(machine=machine, all_free=True).num_gpus == 2
    rental.refresh_from_db()
    assert rental.gpu_clock_since is None and rental.gpu_seconds >= 3600
    assert rental.storage_clock_since is not None  # storage is still charged while stopped

    body = client.post(f"/api/v1/instances/{instance_id}/start/").json()
    assert body["state"] == "running"
    assert docker_inspect(instance.container_id)["State"]["Running"] is True
    assert GpuAllocation.objects.get(instance=instance, released_at=None).gpu_id == first_gpu

    hold_before = Hold.objects.get(pk=rental.hold_id).amount
    ends_before = rental.ends_at
    assert (
        client.post(
            f"/api/v1/instances/{instance_id}/extend/", {"hours": 2}, format="json"
        ).status_code
        == 200
    )
    rental.refresh_from_db()
    assert rental.ends_at == ends_before + timedelta(hours=2)
    # 2 more hours: $0.50/GPU-h × 1 GPU × 2 h = 1,000,000 µ$; $0.10/GB-month × 10 GB ×
    # 7,200 s / 2,592,000 s = 2,777.8 → 2,778 µ$.
    assert Hold.objects.get(pk=rental.hold_id).amount == hold_before + 1_002_778

    available_before = (
        team_balance(funded_team.pk).available + Hold.objects.get(pk=rental.hold_id).amount
    )
    assert client.delete(f"/api/v1/instances/{instance_id}/").status_code == 202
    instance.refresh_from_db()
    assert instance.state == "destroyed"
    assert containers_named(instance.container_name) == []
    rental.refresh_from_db()
    assert rental.settled_at is not None
    hold = Hold.objects.get(pk=rental.hold_id)
    # Both clocks ran the hour moved back plus the seconds this test took (real time, so the
    # seconds are read back; a minute bounds them). Charged per second, rounded once, half up:
    # GPU 500,000 µ$/h × s / 3,600; storage $0.10 × 10 GB = 1,000,000 µ$/month × s / 2,592,000.
    # At 3,600 s that is 500,000 + 1,389 = 501,389 µ$; at 3,660 s, 508,333 + 1,412 = 509,745.
    gpu_s, storage_s = rental.gpu_seconds, rental.storage_seconds
    assert 3_600 <= gpu_s <= storage_s <= 3_660
    owed_gpu = (500_000 * gpu_s + 1_800) // 3_600
    owed_storage = (1_000_000 * storage_s + 1_296_000) // 2_592_000
    assert 501_389 <= owed_gpu + owed_storage <= 509_745
    assert hold.captured == owed_gpu + owed_storage
    assert team_balance(funded_team.pk).held == 0
    assert team_balance(funded_team.pk).available == available_before - hold.captured
    assert not PortAllocation.objects.filter(instance=instance, released_at=None).exists()


def test_metering_captures_only_what_is_new(funded_team, machine):
    client = key_client(funded_team)
    instance_id = rent(client, machine, num_gpus=1).json()["id"]
    rental = Rental.objects.get(instance_id=instance_id)
    start = timezone.now()
    # Both clocks read exactly 0 s at ``start``: the seconds the launch took (storage runs from
    # the rental's first moment; a slow machine may already have captured a micro-dollar of
    # them) are taken off the clocks, and what was captured already is subtracted below.
    Rental.objects.filter(pk=rental.pk).update(
        gpu_seconds=0, storage_seconds=0, gpu_clock_since=start, storage_clock_since=start
    )
    rental.refresh_from_db()
    captured_before = Hold.objects.get(pk=rental.hold_id).captured
    at = start + timedelta(minutes=90)
    first = rental_meter(rental=rental, now=at)
    # 90 min = 5,400 s: $0.50/GPU-h × 1 GPU × 1.5 h = 750,000 µ$; $0.10/GB-month × 10 GB ×
    # 5,400 s / 2,592,000 s = 2,083.3 → 2,083 µ$.
    assert Hold.objects.get(pk=rental.hold_id).captured == 752_083
    assert first == 752_083 - captured_before
    assert rental_meter(rental=rental, now=at) == 0


def test_expiry_stops_then_deletes_after_the_grace_period(funded_team, machine):
    client = key_client(funded_team)
    instance_id = rent(client, machine, num_gpus=1).json()["id"]
    instance = Instance.objects.get(pk=instance_id)
    now = timezone.now()
    # Rented two hours ago for two hours (less a second): both clocks ran all along.
    Rental.objects.filter(instance=instance).update(
        starts_at=now - timedelta(hours=2), ends_at=now - timedelta(seconds=1),
        gpu_clock_since=now - timedelta(hours=2), storage_clock_since=now - timedelta(hours=2),
    )  # fmt: skip
    available_before = team_balance(funded_team.pk).available
    held = Hold.objects.get(pk=Rental.objects.get(instance=instance).hold_id).amount
    expiry_sweep()
    instance.refresh_from_db()
    assert instance.state == "expired"
    assert docker_inspect(instance.container_id)["State"]["Running"] is False
    rental = Rental.objects.get(instance=instance)
    hold = Hold.objects.get(pk=rental.hold_id)
    assert rental.settled_at is not None and hold.closed_at is not None
    # Charged up to the end date and not a second past it; the rest of the hold came back.
    assert rental.gpu_seconds == rental.storage_seconds == 2 * 3600 - 1
    # 7,199 s: $0.50/GPU-h × 7,199 / 3,600 = 999,861.1 → 999,861 µ$; $0.10/GB-month × 10 GB ×
    # 7,199 s / 2,592,000 s = 2,777.4 → 2,777 µ$.
    owed = 1_002_638
    assert hold.captured == owed
    assert team_balance(funded_team.pk).held == 0
    assert team_balance(funded_team.pk).available == available_before + held - owed
    assert client.post(f"/api/v1/instances/{instance_id}/start/").status_code == 409
    Rental.objects.filter(pk=rental.pk).update(
        data_delete_after=timezone.now() - timedelta(seconds=1)
    )
    expiry_sweep()
    instance.refresh_from_db()
    assert instance.state == "destroyed"
    assert containers_named(instance.container_name) == []


def test_short_credit_is_402_and_writes_nothing(team, owner, machine):
    fund(team, dollars=1)
    client = key_client(team)
    before = (
        Instance.objects.count(),
        Rental.objects.count(),
        Hold.objects.count(),
        GpuAllocation.objects.count(),
    )
    response = rent(client, machine, duration_hours=100)
    assert response.status_code == 402
    assert response.json()["error"]["code"] == "insufficient_credit"
    after = (
        Instance.objects.count(),
        Rental.objects.count(),
        Hold.objects.count(),
        GpuAllocation.objects.count(),
    )
    assert after == before
    assert team_balance(team.pk).held == 0


def test_bad_input_names_the_field_and_writes_nothing(funded_team, machine):
    client = key_client(funded_team)
    cases = {
        "image": {"image": "busybox; rm -rf /"},
        "env": {"env": {"NVIDIA_VISIBLE_DEVICES": "all"}},
        "ports": {"ports": [0]},
        "num_gpus": {"num_gpus": 99},
        "duration_hours": {"duration_hours": -1},
        "entrypoint": {"entrypoint": "--privileged"},
    }
    for field, override in cases.items():
        response = rent(client, machine, **override)
        assert response.status_code == 400, (field, response.content)
        assert field in response.json()["error"]["fields"], (field, response.json())
    assert Instance.objects.count() == 0 and Hold.objects.count() == 0


def test_a_redelivered_launch_makes_no_second_container(funded_team, machine):
    client = key_client(funded_team)
    instance_id = rent(client, machine, num_gpus=1).json()["id"]
    instance = Instance.objects.get(pk=instance_id)
    # As if the worker died after `docker run` but before recording it: back to launching.
    Instance.objects.filter(pk=instance_id).update(state="launching", container_id="")
    assert rental_launch(instance_id) == "running"  # adopts the container it finds by name
    adopted = Instance.objects.get(pk=instance_id).container_id
    assert adopted == instance.container_id
    assert rental_launch(instance_id) == "running"  # delivered once more: nothing to do
    assert len(containers_named(instance.container_name)) == 1
    instance.refresh_from_db()
    assert instance.container_id == adopted and instance.state == "running"


def test_outsider_cannot_see_or_touch_the_rental(funded_team, machine, outsider, client):
    instance_id = rent(key_client(funded_team), machine, num_gpus=1).json()["id"]
    client.force_login(outsider)
    assert client.get("/api/v1/instances/").json()["results"] == []
    assert client.get(f"/api/v1/instances/{instance_id}/").status_code == 404
    assert client.post(f"/api/v1/instances/{instance_id}/stop/").status_code == 404
    assert client.delete(f"/api/v1/instances/{instance_id}/").status_code == 404
    assert client.get(f"/instances/{instance_id}/").status_code == 404
    assert client.post(f"/instances/{instance_id}/destroy/").status_code == 404
    assert Instance.objects.get(pk=instance_id).state == "running"


def test_twenty_renters_race_for_the_last_gpu(sim_host_factory, provider_team, settings):
    """Exactly one rental; 19 clean 409s; no hold or allocation left behind."""
    import threading

    from django.db import connection

    from marketplace.models import Role
    from tests.factories import TeamFactory, UserFactory, add_member

    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    clients = []
    for n in range(20):
        team = TeamFactory(name=f"racer {n}")
        add_member(team, UserFactory(username=f"racer{n}"), Role.OWNER)
        fund(team)
        clients.append(key_client(team))
    barrier = threading.Barrier(20)
    statuses: list[int] = []
    lock = threading.Lock()

    def race(client):
        try:
            barrier.wait()
            response = rent(client, machine, num_gpus=1, ports=[], duration_hours=1)
            with lock:
                statuses.append(response.status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(statuses) == [201] + [409] * 19
    assert Rental.objects.filter(machine=machine).count() == 1
    assert Hold.objects.count() == 1
    assert GpuAllocation.objects.filter(released_at=None, gpu__machine=machine).count() == 1
    assert Instance.objects.filter(machine=machine).count() == 1


def test_charges_stop_while_the_machine_is_offline(
    funded_team, sim_host_factory, provider_team, settings
):
    from hosts import services as host_services

    settings.HOST_HEARTBEAT_MISSES = 1
    host = sim_host_factory(gpus=1)
    machine = machine_for(host, provider_team)
    instance_id = rent(key_client(funded_team), machine, num_gpus=1, ports=[]).json()["id"]
    rental = Rental.objects.get(instance_id=instance_id)
    assert rental.gpu_clock_since is not None and rental.storage_clock_since is not None
    host.stop()
    try:
        host_services.machine_heartbeat(machine_id=machine.pk)
        rental.refresh_from_db()
        assert rental.gpu_clock_since is None and rental.storage_clock_since is None
        frozen = (rental.gpu_seconds, rental.storage_seconds)
        assert rental_owed(rental, timezone.now() + timedelta(hours=5)) == rental_owed(
            rental, timezone.now()
        )
    finally:
        host.start()
    host_services.machine_heartbeat(machine_id=machine.pk)
    rental.refresh_from_db()
    assert rental.gpu_clock_since is not None and rental.storage_clock_since is not None
    assert (rental.gpu_seconds, rental.storage_seconds) == frozen


def test_an_image_that_cannot_be_pulled_fails_the_launch_cleanly(funded_team, machine):
    client = key_client(funded_team)
    # A registry on loopback that is not there: the pull fails without leaving the machine.
    body = rent(client, machine, num_gpus=1, image="127.0.0.1:5999/no-such-image:1").json()
    instance = Instance.objects.get(pk=body["id"])
    assert instance.state == "failed"
    assert "could not pull 127.0.0.1:5999/no-such-image:1" in instance.status_message
    assert containers_named(instance.container_name) == []
    assert not GpuAllocation.objects.filter(instance=instance, released_at=None).exists()
    assert Offer.objects.get(machine=machine, all_free=True).num_gpus == 4


def test_console_warns_when_credit_would_not_cover_another_hour(team, owner, machine, client):
    fund(team, dollars=3)  # $0.50/GPU-hour × 2 GPUs for 2 hours holds $2 (+ storage)
    rent(key_client(team), machine, num_gpus=2, duration_hours=2)
    client.force_login(owner)
    session = client.session
    session["active_team_id"] = team.pk
    session.save()
    page = client.get("/instances/").content.decode()
    assert 'id="low-balance"' in page and "Top up" in page
    fund(team, dollars=50)
    assert 'id="low-balance"' not in client.get("/instances/").content.decode()


def renter_public_key() -> str:
    """A renter's own new key, made here: the test needs no file another test left behind."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate().public_key()
    openssh = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return openssh.decode() + " renter@laptop"


def test_ssh_keys_are_checked_when_added(funded_team):
    """(SSH mode itself, logging in through the published port: test_launch_modes.py.)"""
    client = key_client(funded_team)
    public_key = renter_public_key()
    added = client.post(
        "/api/v1/ssh-keys/", {"name": "laptop", "public_key": public_key}, format="json"
    )
    assert added.status_code == 201, added.content
    bad = client.post(
        "/api/v1/ssh-keys/", {"name": "x", "public_key": "ssh-ed25519 not-base64!"}, format="json"
    )
    assert bad.status_code == 400 and "public_key" in bad.json()["error"]["fields"]
    again = client.post(
        "/api/v1/ssh-keys/", {"name": "again", "public_key": public_key}, format="json"
    )
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]


def test_ssh_keys_page_adds_refuses_by_field_and_removes(funded_team, owner, client):
    from marketplace.models import SshKey
    from tests.conftest import client_for
    from tests.marketplace.test_console_actions import page_messages

    console = client_for(client, owner, funded_team)
    public_key = renter_public_key()
    response = console.post(
        "/ssh-keys/", {"name": " laptop ", "public_key": public_key}, follow=True
    )
    key = SshKey.objects.get()
    assert page_messages(response) == [f"Key laptop added ({key.fingerprint})."]

    refusals = {
        ("", public_key): "name: Give the key a name.",
        ("x", "ssh-ed25519 not-base64!"): "public key: The key's base64 part is damaged.",
        ("again", public_key): "public key: This key is already on the team.",
    }
    for (name, line), message in refusals.items():
        response = console.post("/ssh-keys/", {"name": name, "public_key": line}, follow=True)
        assert page_messages(response) == [message]
    assert list(SshKey.objects.all()) == [key]

    # A removal that names no key id is a key that is not there.
    assert console.post("/ssh-keys/", {"delete": "laptop"}).status_code == 404
    assert SshKey.objects.count() == 1
    response = console.post("/ssh-keys/", {"delete": str(key.pk)}, follow=True)
    assert page_messages(response) == ["Key laptop removed."]
    assert not SshKey.objects.exists()


def test_private_registry_login_is_stored_encrypted_and_used_for_the_pull(funded_team, machine):
    client = key_client(funded_team)
    secret = "s3cret-token-$(id)"
    body = rent(
        client, machine, num_gpus=1, image="127.0.0.1:5999/team/private:1",
        registry_username="robot", registry_password=secret,
    ).json()  # fmt: skip
    instance = Instance.objects.get(pk=body["id"])
    assert secret not in str(Instance.objects.filter(pk=instance.pk).values().get())
    assert "registry_password" not in body and secret not in str(body)
    # The login to the (absent) loopback registry fails; the message says so, not the secret.
    assert instance.state == "failed"
    assert "could not log in to the registry 127.0.0.1:5999" in instance.status_message
    assert secret not in instance.status_message
    half = rent(client, machine, num_gpus=1, registry_username="robot")
    assert half.status_code == 400 and "registry_username" in half.json()["error"]["fields"]


def test_console_rent_splits_arguments_like_a_shell_and_refuses_an_open_quote(
    funded_team, owner, machine, client
):
    from tests.conftest import client_for

    console = client_for(client, owner, funded_team)
    form = {
        "num_gpus": "1", "duration_hours": "1", "disk_gb": "10", "launch_mode": "entrypoint",
        "image": "gpumkt/busybox:latest", "entrypoint": "sh",
    }  # fmt: skip
    response = console.post(
        f"/offers/{machine.pk}/rent/", {**form, "args": "-c 'echo it; exec sleep 600"}
    )
    assert response.status_code == 302 and Hold.objects.count() == 0
    messages = [m.message for m in response.wsgi_request._messages]
    assert any("args" in m and "Cannot split" in m for m in messages), messages
    assert Instance.objects.count() == 0 and GpuAllocation.objects.count() == 0

    response = console.post(
        f"/offers/{machine.pk}/rent/", {**form, "args": "-c 'echo \"a  b\"; exec sleep 600'"}
    )
    instance = Instance.objects.get()
    assert response.status_code == 302 and response.url == f"/instances/{instance.pk}/"
    instance.refresh_from_db()
    assert instance.state == "running", instance.status_message
    assert docker_inspect(instance.container_id)["Args"] == ["-c", 'echo "a  b"; exec sleep 600']


def test_the_quote_before_renting_is_what_the_rental_holds(
    funded_team, sim_host_factory, provider_team
):
    """rate × GPUs × hours + storage (GB-month prorated over 720 hours), shown before
    confirming; renting with the same choices holds exactly that much."""
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    client = key_client(funded_team)
    choice = {"num_gpus": 2, "duration_hours": 3, "disk_gb": 20}
    quote = client.get(f"/api/v1/offers/{machine.pk}/quote/", choice)
    assert quote.status_code == 200
    # $0.50/GPU-hour × 2 × 3 h; $0.10/GB-month × 20 GB × 3/720 of a month.
    money = {key: quote.json()[key] for key in ("gpu", "storage", "total")}
    assert money == {"gpu": "3.000000", "storage": "0.008333", "total": "3.008333"}
    available_before = team_balance(funded_team.pk).available
    instance_id = rent(client, machine, **choice).json()["id"]
    hold = Hold.objects.get(pk=Rental.objects.get(instance_id=instance_id).hold_id)
    assert hold.amount == 3_008_333
    assert team_balance(funded_team.pk).available == available_before - 3_008_333

    bad = client.get(f"/api/v1/offers/{machine.pk}/quote/", {**choice, "num_gpus": 0})
    assert bad.status_code == 400 and "num_gpus" in bad.json()["error"]["fields"]
    assert client.get("/api/v1/offers/999999/quote/", choice).status_code == 404
