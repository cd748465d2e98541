"""Units, the provider's new API endpoints and the fleet dashboard, with an owner, a teammate
and an outsider. Machines are rows as a probe leaves them; charges go through billing's own
hold and capture services."""

from __future__ import annotations

import base64
import hashlib

import pytest
from django.test import Client
from django.utils import timezone

from billing.credits import credit_grant
from billing.holds import hold_capture_usage, hold_create
from hosts.keys import team_public_key
from hosts.models import Gpu, HeartbeatSample, Machine, MachineStatus
from hosts.runtime import ContainerSpec, docker_run_argv
from marketplace.models import ApiKey
from tests.conftest import client_for, key_client
from tests.factories import TeamFactory

pytestmark = pytest.mark.django_db


def machine_of(team, *, name="big", gpus=8, status=MachineStatus.ONLINE, **figures) -> Machine:
    values = {"cpu_cores": 128, "ram_mb": 720 * 1024, "disk_free_gb": 720, **figures}
    machine = Machine.objects.create(
        team=team, name=name, address=f"{name}.example.com", port=22, status=status,
        host_key_type="ssh-ed25519", host_key="AAAA", probed_at=timezone.now(), **values,
    )  # fmt: skip
    Gpu.objects.bulk_create(
        Gpu(machine=machine, index=i, uuid=f"GPU-{i:08d}-0000-4000-8000-{machine.pk:012d}",
            name="NVIDIA H100 80GB HBM3", memory_mib=81559)
        for i in range(gpus)
    )  # fmt: skip
    return machine


def charge(provider_team, machine, *, gross: int) -> None:
    """A renter is charged ``gross`` micro-dollars on the machine (10% platform fee)."""
    renter = TeamFactory()
    key = f"test-{machine.pk}-{gross}"
    credit_grant(team_id=renter.pk, amount=10 * gross, reason="test", idempotency_key=key)
    hold = hold_create(
        team_id=renter.pk, provider_team_id=provider_team.pk, amount=2 * gross,
        reference=f"rental:{key}", idempotency_key=f"hold-{key}",
        machine_reference=f"machine:{machine.pk}",
    )  # fmt: skip
    hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=gross)


def session(user, team=None) -> Client:
    return client_for(Client(), user, team)


# --- units ---------------------------------------------------------------------------------


def test_units_of_the_issues_example_on_the_page_in_the_api_and_in_docker(team, owner):
    machine = machine_of(team)  # 8 GPUs, 128 cores, 720 GB RAM, 720 GB disk
    assert (machine.unit_cpus, machine.unit_memory_mb, machine.unit_disk_gb) == (16, 92160, 90)
    page = session(owner, team).get(f"/machines/{machine.pk}/").content.decode()
    assert "1 GPU + 16 cores" in page and "90 GiB RAM · 90 GiB disk" in page
    api = key_client(team, audience=ApiKey.Audience.PROVIDER)
    unit = api.get(f"/api/v1/machines/{machine.pk}/").json()["unit"]
    assert unit == {"gpus": 1, "cpus": 16.0, "memory_mb": 92160, "disk_gb": 90, "shm_mb": 46080}
    argv = docker_run_argv(
        ContainerSpec(name="c", image="busybox", cpus=machine.unit_cpus * 3,
                      memory_mb=machine.unit_memory_mb * 3, shm_mb=machine.unit_shm_mb * 3),
        machine_id=machine.pk, nvidia_runtime=True,
    )  # fmt: skip
    assert argv[argv.index("--cpus") + 1] == "48"
    assert argv[argv.index("--cpu-shares") + 1] == str(3 * 16 * 1024)  # 3 units' weight


# --- the API -------------------------------------------------------------------------------


def test_platform_key_for_api_only_providers(team, owner, teammate, outsider):
    provider_key = key_client(team, audience=ApiKey.Audience.PROVIDER)
    body = provider_key.get("/api/v1/machines/platform-key/").json()
    assert body["public_key"] == team_public_key(team.pk)
    assert body["public_key"].startswith("ssh-ed25519 ")
    blob = base64.b64decode(body["public_key"].split()[1])
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    assert body["fingerprint"] == f"SHA256:{digest}"  # as ssh-keygen -lf prints it
    assert session(teammate, team).get("/api/v1/machines/platform-key/").json() == body
    # Each team has its own key: the outsider's would not open this team's machines.
    theirs = session(outsider).get("/api/v1/machines/platform-key/").json()
    assert theirs["public_key"].startswith("ssh-ed25519 ")
    assert theirs["public_key"].split()[1] != body["public_key"].split()[1]
    assert Client().get("/api/v1/machines/platform-key/").status_code in (401, 403)
    renter_key = key_client(team, audience=ApiKey.Audience.RENTER)
    assert renter_key.get("/api/v1/machines/platform-key/").status_code == 403


def test_gpu_states_in_the_api(team, owner):
    online = machine_of(team, name="up", gpus=3)
    Gpu.objects.filter(machine=online, index=2).update(present=False)
    offline = machine_of(team, name="down", gpus=1, status=MachineStatus.OFFLINE)
    api = key_client(team, audience=ApiKey.Audience.PROVIDER)
    listed = {m["name"]: m for m in api.get("/api/v1/machines/").json()["results"]}
    assert [g["state"] for g in listed["up"]["gpus"]] == ["free", "free", "missing"]
    assert [g["state"] for g in listed["down"]["gpus"]] == ["offline"]
    one = api.get(f"/api/v1/machines/{online.pk}/").json()
    assert one["gpus"] == listed["up"]["gpus"]
    assert api.get(f"/api/v1/machines/{offline.pk}/").json()["gpus"][0]["state"] == "offline"


def test_history_endpoint_has_the_charts_data_for_the_team_only(team, owner, teammate, outsider):
    machine = machine_of(team, gpus=4)
    for ok, rented in ((True, 1), (True, 3), (False, 3)):
        HeartbeatSample.objects.create(machine=machine, ok=ok, gpus_total=4, gpus_rented=rented)
    url = f"/api/v1/machines/{machine.pk}/history/"
    body = key_client(team, audience=ApiKey.Audience.PROVIDER).get(url).json()
    assert len(body) == 1
    point = body[0]
    assert point["samples"] == 3 and point["answered"] == pytest.approx(2 / 3)
    assert point["utilization"] == pytest.approx((1 + 3 + 3) / 3 / 4) and point["gpus"] == 4
    assert session(teammate, team).get(url).json() == body
    assert session(outsider).get(url).status_code == 404
    bad = session(owner, team).get(url + "?hours=0")
    assert bad.status_code == 400 and "hours" in bad.json()["error"]["fields"]


def test_earnings_endpoint_per_day_for_the_team_only(team, owner, teammate, outsider):
    machine = machine_of(team)
    other = machine_of(team, name="other")
    charge(team, machine, gross=2_000_000)
    charge(team, other, gross=5_000_000)  # another machine's charges stay out
    url = f"/api/v1/machines/{machine.pk}/earnings/"
    days = key_client(team, audience=ApiKey.Audience.PROVIDER).get(url + "?days=7").json()
    assert len(days) == 7 and days[-1]["day"] == timezone.localdate().isoformat()
    assert days[-1] | {"day": None} == {
        "day": None,
        "gross": "2.000000",
        "fee": "0.200000",
        "net": "1.800000",
    }
    assert all(d["gross"] == "0.000000" for d in days[:-1])
    assert session(teammate, team).get(url + "?days=7").json() == days
    assert session(outsider).get(url).status_code == 404
    assert session(owner, team).get(url + "?days=400").status_code == 400


# --- the dashboard -------------------------------------------------------------------------


def test_machine_page_draws_thirty_days_of_earnings(team, owner, outsider):
    machine = machine_of(team)
    page = session(owner, team).get(f"/machines/{machine.pk}/").content.decode()
    assert 'id="no-earnings"' in page
    charge(team, machine, gross=2_000_000)
    page = session(owner, team).get(f"/machines/{machine.pk}/").content.decode()
    today = timezone.localdate().strftime("%m-%d")
    assert f"{today}: $2.00 charged, $0.20 platform fee, $1.80 earned" in page
    assert "$1.80 earned · $2.00 charged · $0.20 platform fee" in page
    assert page.count('class="bar-fee"') == 1  # one day with charges
    assert session(outsider).get(f"/machines/{machine.pk}/").status_code == 404


def test_machines_list_summarises_the_fleet(team, owner, teammate, outsider):
    busy = machine_of(team, name="busy", gpus=2)
    Gpu.objects.filter(machine=busy, index=1).update(present=False)
    machine_of(team, name="broken", gpus=1, status=MachineStatus.ERROR)
    machine_of(team, name="gone", gpus=1, status=MachineStatus.OFFLINE)
    charge(team, busy, gross=3_000_000)
    page = session(teammate, team).get("/machines/").content.decode()
    assert "1 online" in page and "1 offline" in page and "1 error" in page
    assert "0 rented · 1 free · 2 offline · " in page and "1 missing" in page
    assert "$2.70" in page and "$3.00 charged · $0.30 platform fee" in page
    assert 'data-earned="2700000"' in page
    elsewhere = session(outsider).get("/machines/").content.decode()
    assert "busy" not in elsewhere and "$2.70" not in elsewhere
