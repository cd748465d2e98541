"""Tenancy matrix: owner, teammate and outsider over every console page and API endpoint.

Two teams hold the same kinds of data (a machine with a rental on it, credit, a capture, an SSH
key, an API key, an invitation, a top-up, a maintenance window): Acme (owner + teammate) and
the outsider's personal team. For every route:

- a page or list answers the owner and the teammate with Acme's data, and the outsider with
  their own data and none of Acme's;
- an object of Acme's answers the owner and the teammate (GET), and the outsider 404 for
  every method, with nothing changed in the database and no task queued.

The route list comes from the URL conf: a route that is neither in ``MATRIX`` nor in
``EXEMPT`` (with the reason) fails ``test_every_route_is_in_the_matrix``, listed as uncovered,
and so does an API action method the matrix does not try.

One file on purpose, past the ~600-line habit: the world, the matrix and the route check are
read together, and a route added anywhere must meet all three here.
"""

from __future__ import annotations

import importlib
import io
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from decimal import Decimal

import pypdf
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.apps import apps
from django.db import transaction
from django.db.models import Model
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from django.utils.html import escape

from billing.credits import credit_grant
from billing.holds import hold_capture_usage, hold_create
from billing.models import Entry, Hold, PayoutRequest, TopUp, Transfer
from billing.payouts import payout_reject, payout_request_create
from billing.selectors import invoice_months, team_balance
from hosts.models import Gpu, Machine, MaintenanceWindow
from hosts.services import maintenance_window_add
from marketplace.clusters.services import ClusterSpec, cluster_create
from marketplace.deployments.services import DeploymentSpec, deployment_create
from marketplace.models import (
    ApiKey,
    Cluster,
    CommittedImage,
    Deployment,
    Invitation,
    Membership,
    Replica,
    Role,
    SshKey,
    Team,
    Volume,
    VolumeVersion,
)
from marketplace.rentals.renting import RentalRequest, rental_create
from marketplace.services.accounts import api_key_create, invitation_create
from marketplace.services.offers import offer_refresh
from marketplace.services.ssh_keys import ssh_key_add
from scheduler.models import Instance
from tests.conftest import client_for
from tests.factories import TeamFactory, UserFactory, add_member

pytestmark = pytest.mark.django_db

# --- two teams with the same kinds of data ---------------------------------------------------


@dataclass
class World:
    """One team's data; ``tag`` makes every name in it unique to the team."""

    tag: str
    team: Team
    machine: Machine
    instance: Instance
    hold: Hold
    entry: Entry
    ssh_key: SshKey
    api_key: ApiKey
    invitation: Invitation
    invitation_token: str
    topup: TopUp
    window: MaintenanceWindow
    payout: PayoutRequest  # asked of the team's earnings from its own machine
    member: Membership  # a membership other teams must not touch
    member_email: str
    month: str = field(default_factory=lambda: f"{timezone.now():%Y-%m}")


def public_key() -> str:
    key = Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


def build_world(
    *, tag: str, team: Team, admin: Membership, member: Membership, n: int, dollars: int
) -> World:
    # An address from TEST-NET-1 (RFC 5737): nothing here may connect to it, and nothing does,
    # because the outsider is refused before any command would run.
    machine = Machine.objects.create(
        team=team, name=f"{tag}-rig", address=f"192.0.2.{n}", port=22, status="online",
        listed=True, price_per_gpu_hour=500_000, storage_price_per_gb_month=100_000,
        cpu_cores=16, ram_mb=65536, disk_free_gb=200, host_key_type="ssh-ed25519",
        host_key="AAAA", host_key_fingerprint=f"SHA256:{tag}-pinned",
        offered_key_fingerprint=f"SHA256:{tag}-offered", location="US",
    )  # fmt: skip
    Gpu.objects.bulk_create(
        Gpu(machine=machine, index=i, uuid=f"GPU-{uuid.uuid4()}", name="NVIDIA RTX 4090",
            memory_mib=24564, present=True)
        for i in range(2)
    )  # fmt: skip
    offer_refresh(machine_id=machine.pk)
    credit_grant(
        team_id=team.pk, amount=dollars * 1_000_000, reason="matrix credit",
        idempotency_key=f"matrix-{tag}-{team.pk}",
    )  # fmt: skip
    rental = rental_create(
        team=team,
        request=RentalRequest(
            machine_id=machine.pk, gpu_count=1, image=f"{tag}/trainer:1", hours=2
        ),
    ).rental
    hold_capture_usage(hold_id=rental.hold_id, kind="gpu", owed_total=dollars * 1_000)
    now = timezone.now()
    window = maintenance_window_add(
        machine_id=machine.pk,
        starts_at=now + timedelta(days=10),
        ends_at=now + timedelta(days=10, hours=2),
        note=f"{tag} maintenance",
    )
    issued = invitation_create(membership=admin, email=f"{tag}-invitee@example.com")
    with override_settings(BILLING_PAYOUT_MIN=10_000):  # the team earned cents here
        payout, _ = payout_request_create(team_id=team.pk, amount=10_000)
    return World(
        tag=tag,
        team=team,
        machine=machine,
        instance=rental.instance,
        hold=Hold.objects.get(pk=rental.hold_id),
        entry=Entry.objects.filter(team=team).order_by("pk").first(),
        ssh_key=ssh_key_add(team=team, name=f"{tag}-laptop", public_key=public_key()),
        api_key=api_key_create(membership=admin, name=f"{tag}-ci-key").api_key,
        invitation=issued.invitation,
        invitation_token=issued.token,
        topup=TopUp.objects.create(
            team=team,
            amount=25_000_000,
            checkout_session_id=f"cs_test_{tag}",
            checkout_url=f"https://checkout.stripe.com/c/pay/cs_test_{tag}",
        ),  # fmt: skip
        window=window,
        payout=payout,
        member=member,
        member_email=member.user.email,
    )


@dataclass
class Worlds:
    acme: World
    theirs: World  # the outsider's own team


@dataclass
class Shared:
    """What the module's tests share: the three users and both worlds."""

    owner: object
    teammate: object
    outsider: object
    worlds: Worlds


@pytest.fixture(scope="module")
def shared(django_db_setup, django_db_blocker) -> Shared:
    """Both worlds, built once for the module (building them was three quarters of its time)
    in a transaction rolled back after its last test. Each test runs in a savepoint inside it
    (pytest-django's ``db``), rolled back when the test ends: every test starts from the same
    world, whatever the tests before it wrote, in any order."""
    with django_db_blocker.unblock(), transaction.atomic():
        team = TeamFactory(name="Acme GPUs")
        owner, teammate, outsider = (
            UserFactory(username=name) for name in ("owner", "teammate", "outsider")
        )
        owner_membership = add_member(team, owner, Role.OWNER)
        acme = build_world(
            tag="acme", team=team, admin=owner_membership,
            member=add_member(team, teammate, Role.MEMBER), n=10, dollars=120,
        )  # fmt: skip
        own = Membership.objects.get(user=outsider, team__personal=True)
        theirs = build_world(tag="theirco", team=own.team, admin=own, member=own, n=11, dollars=50)
        yield Shared(owner, teammate, outsider, Worlds(acme=acme, theirs=theirs))
        transaction.set_rollback(True)


def fresh(instance):
    """The row as the database has it now (a test may have changed the shared instance in
    memory; its writes are rolled back, its attributes would not be)."""
    return type(instance).objects.get(pk=instance.pk)


def fresh_world(world: World) -> World:
    rows = {
        f.name: fresh(getattr(world, f.name))
        for f in fields(world)
        if isinstance(getattr(world, f.name), Model)
    }
    return replace(world, **rows)


@pytest.fixture
def worlds(shared) -> Worlds:
    return Worlds(acme=fresh_world(shared.worlds.acme), theirs=fresh_world(shared.worlds.theirs))


@pytest.fixture
def owner(shared):
    return fresh(shared.owner)


@pytest.fixture
def teammate(shared):
    return fresh(shared.teammate)


@pytest.fixture
def outsider(shared):
    return fresh(shared.outsider)


# --- the checks ------------------------------------------------------------------------------

Url = Callable[[World], str]


@dataclass(frozen=True)
class Page:
    """A page or list (GET): each side sees its own markers and never the other's."""

    url: Url
    markers: Callable[[World], list[str]] = lambda w: []


@dataclass(frozen=True)
class Listing:
    """An API list (GET): the ids in it are the acting team's only."""

    url: Url
    ids: Callable[[World], list[object]]
    key: str = "id"


@dataclass(frozen=True)
class Obj:
    """One of Acme's objects: the owner and the teammate reach it (GET), the outsider gets 404
    for ``method`` and nothing changes."""

    url: Url
    method: str = "get"
    data: dict | None = None


@dataclass(frozen=True)
class Creates:
    """A create (POST) with Acme's team id smuggled into the body: whatever it makes is the
    caller's own, and Acme's rows stay as they were."""

    url: Url
    data: Callable[[World], dict]


@dataclass(frozen=True)
class Custom:
    run: Callable[..., None]


Check = Page | Listing | Obj | Creates | Custom


def smuggled(w: World, **data: object) -> dict:
    return {**data, "team": w.team.pk, "team_id": w.team.pk}


def console_page(url: Url, *markers: Callable[[World], str]) -> Page:
    """A console page; every page shows the active team's name in the header."""
    return Page(url, lambda w: [w.team.name, *(m(w) for m in markers)])


def instance_link(w: World) -> str:
    return f'href="/instances/{w.instance.pk}/"'


def rental_reference(w: World) -> str:
    return f"rental:{w.instance.pk}"


def machine_reference(w: World) -> str:
    return f"machine:{w.machine.pk}"


def credit_entry_ids(w: World) -> list[int]:
    """The team's credit grant, as the vast invoices list it (its available-credit leg)."""
    grants = Entry.objects.filter(team=w.team, transfer__kind="grant", account_kind="available")
    return list(grants.values_list("pk", flat=True))


# Every time there is: the lists below are not about dates.
ALL_DAYS = "select_filters=" + json.dumps({"day": {"gte": 0, "lte": 9_999_999_999}})
ALL_WHENS = "select_filters=" + json.dumps({"when": {"gte": 0, "lte": 9_999_999_999}})


def inst(suffix: str = "") -> Url:
    return lambda w: f"/instances/{w.instance.pk}/{suffix}"


def api_inst(suffix: str = "") -> Url:
    return lambda w: f"/api/v1/instances/{w.instance.pk}/{suffix}"


def mach(suffix: str = "") -> Url:
    return lambda w: f"/machines/{w.machine.pk}/{suffix}"


def api_mach(suffix: str = "") -> Url:
    return lambda w: f"/api/v1/machines/{w.machine.pk}/{suffix}"


def check_team_switch(c: Checker) -> None:
    client = c.outsider()
    client.post("/team/switch/", {"team": c.acme.team.pk, "next": "/instances/"})
    assert client.session.get("active_team_id") != c.acme.team.pk
    page = client.get("/instances/").content.decode()
    assert c.acme.team.name not in page and instance_link(c.acme) not in page


def check_invitation_create(c: Checker) -> None:
    """The form acts on the caller's own team, whatever team id is smuggled in."""
    before = c.rows(Invitation.objects.filter(team=c.acme.team))
    c.outsider().post(
        "/team/invitations/",
        {"email": "sneak@example.com", "role": "owner", "team": c.acme.team.pk},
    )
    assert c.rows(Invitation.objects.filter(team=c.acme.team)) == before
    assert Invitation.objects.filter(team=c.theirs.team, email="sneak@example.com").exists()


def check_me(c: Checker) -> None:
    for client in c.outsider_api_clients():
        body = client.get("/api/v1/me/").json()
        assert body["team"]["id"] == c.theirs.team.pk
    teammate = c.session(c.teammate_user, c.acme.team)
    assert teammate.get("/api/v1/me/").json()["team"]["id"] == c.acme.team.pk


def check_balance(c: Checker) -> None:
    # The two teams were granted and charged different amounts, so their figures differ.
    acme = c.session(c.owner_user, c.acme.team).get("/api/v1/billing/balance/").json()
    assert acme["available"] == dollar_string(team_balance(c.acme.team.pk).available)
    for client in c.outsider_api_clients():
        theirs = client.get("/api/v1/billing/balance/").json()
        assert theirs["available"] == dollar_string(team_balance(c.theirs.team.pk).available)
        assert theirs["available"] != acme["available"]


def dollar_string(micro: int) -> str:
    """Micro-dollars as the API writes money: dollars, a decimal string with 6 places."""
    return f"{Decimal(micro) / 1_000_000:.6f}"


def invoice_totals(w: World) -> list[str]:
    return [dollar_string(total) for _, total in invoice_months(Entry.objects.filter(team=w.team))]


def payout_row(w: World) -> str:
    return f'data-payout="{w.payout.pk}"'


def check_console_payout_ask(c: Checker) -> None:
    """The Payouts form asks for the caller's own team, whatever team id rides along; Acme's
    request, earnings and ledger stay as they were."""
    payout_reject(payout_id=c.theirs.payout.pk, reason="matrix", decided_by_id=None)
    client = c.outsider()
    before = c.team_rows(c.acme.team)
    with override_settings(BILLING_PAYOUT_MIN=10_000):
        response = client.post("/payouts/", smuggled(c.acme, amount="0.02", nonce="matrix"))
    assert response.status_code == 302, response.content
    assert c.team_rows(c.acme.team) == before
    assert PayoutRequest.objects.get(team=c.theirs.team, status="requested").amount == 20_000


def check_deployments(c: Checker) -> None:
    """Acme's deployment and its replica answer 404 on every deployment route, to every
    outsider client, and stay as they were."""
    deployment = deployment_create(
        team=c.acme.team, spec=DeploymentSpec(name="acme", image="busybox:latest")
    )
    replica = deployment.replicas.get()
    base = f"/api/v1/deployments/{deployment.pk}/"
    before = c.rows(Deployment.objects.filter(pk=deployment.pk)), c.rows(Replica.objects.all())
    for client in c.outsider_api_clients():
        assert client.get(base).status_code == 404
        assert (
            client.patch(base, '{"replicas": 5}', content_type="application/json").status_code
            == 404
        )
        assert client.post(f"{base}stop/").status_code == 404
        assert client.get(f"{base}replicas/").status_code == 404
        assert client.post(f"{base}replicas/{replica.pk}/stop/").status_code == 404
        assert client.delete(base).status_code == 404
        listed = client.get("/api/v1/deployments/").json()["results"]
        assert deployment.pk not in [d["id"] for d in listed]
    after = c.rows(Deployment.objects.filter(pk=deployment.pk)), c.rows(Replica.objects.all())
    assert after == before


def _acme_cluster(c: Checker):
    # A GPU no machine has: its replicas wait, so nothing is placed or launched here.
    return cluster_create(
        team=c.acme.team,
        spec=ClusterSpec(name="acme-svc", image="busybox:latest", gpu_names=["No Such GPU"],
                         service_port=8080),
    )  # fmt: skip


def check_clusters(c: Checker) -> None:
    """Acme's cluster answers 404 on every cluster route, to every outsider client, and stays
    as it was; the outsider's list does not show it."""
    cluster = _acme_cluster(c)
    base = f"/api/v1/clusters/{cluster.pk}/"
    before = c.rows(Cluster.objects.filter(pk=cluster.pk)), c.rows(Deployment.objects.all())
    for client in c.outsider_api_clients():
        assert client.get(base).status_code == 404
        assert (
            client.patch(base, '{"image": "evil"}', content_type="application/json").status_code
            == 404
        )
        assert (
            client.post(
                f"{base}scale/", '{"replicas": 9}', content_type="application/json"
            ).status_code
            == 404
        )
        assert (
            client.put(
                f"{base}endpoint/", '{"port": 22}', content_type="application/json"
            ).status_code
            == 404
        )
        assert client.delete(f"{base}endpoint/").status_code == 404
        assert client.post(f"{base}stop/").status_code == 404
        assert client.post(f"{base}resume/").status_code == 404
        assert (
            client.post(
                f"{base}extend/", '{"hours": 5}', content_type="application/json"
            ).status_code
            == 404
        )
        assert client.get(f"{base}replicas/").status_code == 404
        assert client.delete(base).status_code == 404
        listed = client.get("/api/v1/clusters/").json()["results"]
        assert cluster.pk not in [x["id"] for x in listed]
    for client in c.members():
        assert client.get(base).json()["id"] == cluster.pk
    after = c.rows(Cluster.objects.filter(pk=cluster.pk)), c.rows(Deployment.objects.all())
    assert after == before


def check_console_clusters(c: Checker) -> None:
    """The console's cluster pages: Acme's members see Acme's cluster; the outsider neither
    sees it listed nor reaches its page or its buttons (404)."""
    cluster = _acme_cluster(c)
    base = f"/clusters/{cluster.pk}/"
    for client in c.members():
        assert f'href="{base}"' in client.get("/clusters/").content.decode()
        assert client.get(base).status_code == 200
    outsider = c.outsider()
    assert "acme-svc" not in outsider.get("/clusters/").content.decode()
    before = c.rows(Cluster.objects.filter(pk=cluster.pk))
    assert outsider.get(base).status_code == 404
    for action in ("scale", "endpoint", "endpoint-close", "stop", "resume", "extend"):
        assert (
            outsider.post(
                f"{base}{action}/", {"replicas": "9", "port": "22", "hours": "1"}
            ).status_code
            == 404
        )
    assert c.rows(Cluster.objects.filter(pk=cluster.pk)) == before


def check_gateway_auth(c: Checker) -> None:
    """The gateway's auth answer: Acme's members (session or key) pass for Acme's cluster; the
    outsider's session and key get the same 401 as a cluster that does not exist."""
    from marketplace.clusters import auth

    cluster = _acme_cluster(c)
    url = f"/gateway/auth/{cluster.pk}/"
    auth.forget()
    for client in c.members():
        assert client.get(url).status_code == 200
    missing = c.outsider().get("/gateway/auth/999999999/")
    assert missing.status_code == 401
    for client in c.outsider_api_clients():
        refused = client.get(url)
        assert (refused.status_code, refused.content) == (401, missing.content)


def check_volumes(c: Checker) -> None:
    """Acme's volume answers 404 on every volume route to every outsider client, is in no
    list of theirs, and stays as it was; Acme's members read it. (Made as rows: the worlds'
    machines are not reachable, and nothing here may connect to them.)"""
    machine = c.acme.machine
    volume = Volume(team=c.acme.team, provider_team=machine.team, machine=machine,
                    name="acme-data", size_gb=5, storage_price_per_gb_month=100_000,
                    ends_at=timezone.now() + timedelta(days=1), clock_since=timezone.now())  # fmt: skip
    volume.save()
    volume.hold_id = hold_create(
        team_id=c.acme.team.pk, provider_team_id=machine.team_id, amount=1000,
        reference=f"volume:{volume.pk}", idempotency_key=f"matrix-volume-{volume.pk}",
    ).pk  # fmt: skip
    volume.save()
    VolumeVersion.objects.create(volume=volume, number=1, size_gb=5, change="created")
    base = f"/api/v1/volumes/{volume.pk}/"
    before = c.rows(Volume.objects.all()), c.rows(VolumeVersion.objects.all())
    for client in c.outsider_api_clients():
        assert client.get(base).status_code == 404
        body = '{"size_gb": 9}'
        assert client.patch(base, body, content_type="application/json").status_code == 404
        assert client.delete(base).status_code == 404
        assert client.get(f"{base}versions/").status_code == 404
        assert client.get(f"{base}usage/").status_code == 404
        extend = client.post(f"{base}extend/", '{"hours": 5}', content_type="application/json")
        assert extend.status_code == 404
        clone = client.post(f"{base}clone/", '{"name": "mine"}', content_type="application/json")
        assert clone.status_code == 404
        body = json.dumps({"src_id": volume.pk, "dst_id": machine.pk})
        vast_clone = client.post("/api/v0/volumes/copy/", body, content_type="application/json")
        assert vast_clone.status_code == 404
        listed = client.get("/api/v1/volumes/").json()["results"]
        assert volume.pk not in [v["id"] for v in listed]
        # The vast.ai API's show and delete volume.
        vast = client.get("/api/v0/volumes?owner=me").json()["volumes"]
        assert volume.pk not in [v["id"] for v in vast]
        assert client.delete(f"/api/v0/volumes/?id={volume.pk}").status_code == 404
    for client in [c.outsider()]:  # the console's forms, with Acme's volume id
        for action in ("resize", "extend", "delete"):
            data = {"action": action, "volume": volume.pk, "size_gb": 9, "days": 1}
            assert client.post("/volumes/", data).status_code == 404
        assert "acme-data" not in client.get("/volumes/").content.decode()
    for client in c.members():
        assert "acme-data" in client.get("/volumes/").content.decode()
        assert client.get(base).json()["name"] == "acme-data"
        assert [v["size_gb"] for v in client.get(f"{base}versions/").json()] == [5]
    assert (c.rows(Volume.objects.all()), c.rows(VolumeVersion.objects.all())) == before


def check_copy(c: Checker) -> None:
    """``vastai copy`` with Acme's instance on either side: 404 before any host is reached, so
    nothing is opened or copied (tests/vast/test_copy.py copies on real hosts)."""
    theirs, mine = c.acme.instance.pk, c.theirs.instance.pk
    for client in c.outsider_api_clients():
        for kind, src, dst in (("rsync", None, theirs), ("rsync", theirs, None),
                               ("copy_direct", mine, theirs), ("copy_direct", theirs, mine)):  # fmt: skip
            body = json.dumps({"src_id": src, "dst_id": dst, "src_path": "/a", "dst_path": "/b"})
            answer = client.put(f"/api/v0/commands/{kind}/", body, content_type="application/json")
            assert answer.status_code == 404, answer.content


def check_transfer_credit(c: Checker) -> None:
    """``transfer credit`` to Acme's team by an outsider (not one of their teams): refused,
    and no money moves."""
    before = c.rows(Transfer.objects.all())
    for client in c.outsider_api_clients():
        body = json.dumps({"sender": "me", "recipient": c.acme.team.pk, "amount": 1})
        answer = client.put(
            "/api/v0/commands/transfer_credit/", body, content_type="application/json"
        )
        assert answer.status_code in (403, 404), answer.content
    assert c.rows(Transfer.objects.all()) == before


def check_machine_usage(c: Checker) -> None:
    """A machine's GPU and port usage answers 404 to outsiders (API and console); Acme's
    members read its ports, where Acme's own rental is named. (Members' GPU reads ask the
    host's nvidia-smi, and the worlds' machines are not reachable: tests/marketplace/
    test_host_usage.py reads them from a real host.)"""
    machine = c.acme.machine
    for client in c.outsider_api_clients():
        for route in ("gpus", "ports"):
            assert client.get(f"/api/v1/machines/{machine.pk}/{route}/").status_code == 404
    assert c.outsider().get(f"/machines/{machine.pk}/usage/").status_code == 404
    for client in c.members()[:1]:  # the machines API is for admins and up
        ports = client.get(f"/api/v1/machines/{machine.pk}/ports/").json()
        assert ports["machine_id"] == machine.pk and ports["used"] == 0


def check_committed_images(c: Checker) -> None:
    """A team's committed images are listed for its members only."""
    image = CommittedImage.objects.create(
        team=c.acme.team, machine=c.acme.machine, reference="gpumkt-team-1/acme-model:v1",
        instance_id=c.acme.instance.pk, version=1,
    )  # fmt: skip
    for client in c.members():
        assert [i["id"] for i in client.get("/api/v1/images/").json()["results"]] == [image.pk]
    for client in c.outsider_api_clients():
        assert client.get("/api/v1/images/").json()["results"] == []


def check_console_deployments(c: Checker) -> None:
    """The console's deployment pages: Acme's members see Acme's deployment; the outsider
    neither sees it listed nor reaches it (404 for the page, scale, stop and replica stop),
    and a create with Acme's team id smuggled in makes the outsider's own."""
    deployment = deployment_create(
        team=c.acme.team, spec=DeploymentSpec(name="acme-web", image="busybox:latest")
    )
    replica = deployment.replicas.get()
    base = f"/deployments/{deployment.pk}/"
    for client in c.members():
        assert f'href="{base}"' in client.get("/deployments/").content.decode()
        page = client.get(base)
        assert page.status_code == 200 and f'data-replica="{replica.pk}"' in page.content.decode()
    outsider = c.outsider()
    assert "acme-web" not in outsider.get("/deployments/").content.decode()
    posts = [
        (f"{base}scale/", {"replicas": "5"}),
        (f"{base}stop/", {}),
        (f"{base}replicas/{replica.pk}/stop/", {}),
    ]
    before = c.database()
    with c.capture() as queued:
        assert outsider.get(base).status_code == 404
        assert outsider.get(base, HTTP_HX_REQUEST="true").status_code == 404
        for url, data in posts:
            assert outsider.post(url, data).status_code == 404, url
    assert queued == [] and c.database() == before
    acme_rows = c.team_rows(c.acme.team)
    outsider.post(
        "/deployments/", smuggled(c.acme, name="sneak", image="busybox:latest", replicas="0")
    )
    assert c.team_rows(c.acme.team) == acme_rows
    assert Deployment.objects.filter(team=c.theirs.team, name="sneak").exists()


def check_console_deployments_matching(c: Checker) -> None:
    """The create form's live match count reads the public market (the offers every team
    sees): the same answer to Acme's members and the outsider, and it writes nothing."""
    url = "/deployments/matching/?gpu_names=RTX+4090&gpus_per_replica=1"
    clients = [*c.members(), c.outsider()]  # signed in before the database is read
    before = c.database()
    with c.capture() as queued:
        answers = {client.get(url).content.decode() for client in clients}
    assert answers == {"2 machines match now"}  # Acme's rig and the outsider's
    assert queued == [] and c.database() == before


def check_vast_list_machine(c: Checker) -> None:
    """``vastai list machine <Acme's machine>`` by the outsider (the id rides in the body):
    404, and neither the terms nor the listing change."""
    body = {"machine": c.acme.machine.pk, "price_gpu": 0.01, "min_chunk": 1}
    for client in c.outsider_api_clients():
        before = c.database()
        with c.capture() as queued:
            response = _send(client, "put", "/api/v0/machines/create_asks/", body)
        assert response.status_code == 404, response.content
        assert response.json()["error"]["code"] == "not_found"
        assert queued == [] and c.database() == before


def check_templates(c: Checker) -> None:
    """Acme's private template: its members list and read it; to the outsider (v1 and the
    vast.ai API alike) it is in no list and every route answers 404, changing nothing. A public
    one the outsider lists and reads, but cannot change or delete."""
    from marketplace.services.templates import template_create

    fields = {"name": "acme-tpl", "image": "busybox:latest"}
    private = template_create(team=c.acme.team, user=None, fields=fields)
    public = template_create(
        team=c.acme.team, user=None, fields={**fields, "name": "acme-shared", "public": True}
    )
    for client in c.members():
        listed = [t["id"] for t in client.get("/api/v1/templates/").json()["results"]]
        assert {private.pk, public.pk} <= set(listed)
        assert client.get(f"/api/v1/templates/{private.pk}/").status_code == 200
    base = f"/api/v1/templates/{private.pk}/"
    tries = [
        ("get", base, None),
        ("patch", base, {"name": "sneak"}),
        ("put", base, {"name": "sneak", "image": "x"}),
        ("delete", base, None),
        ("post", f"{base}rent/", {"machine_id": c.theirs.machine.pk, "num_gpus": 1}),
        ("patch", f"/api/v1/templates/{public.pk}/", {"name": "sneak"}),
        ("delete", f"/api/v1/templates/{public.pk}/", None),
        ("delete", "/api/v0/template/", {"hash_id": private.hash_id}),
        ("delete", "/api/v0/template/", {"hash_id": public.hash_id}),
        ("put", "/api/v1/template/", {"hash_id": public.hash_id, "name": "x", "image": "x"}),
    ]
    for client in c.outsider_api_clients():
        listed = [t["id"] for t in client.get("/api/v1/templates/").json()["results"]]
        assert private.pk not in listed and public.pk in listed
        vast = [t["id"] for t in client.get("/api/v0/template/").json().get("templates", [])]
        assert private.pk not in vast
        for method, url, data in tries:
            before = c.database()
            with c.capture() as queued:
                response = _send(client, method, url, data)
            assert response.status_code == 404, (method, url, response.content)
            assert queued == [] and c.database() == before, (method, url)
        before = c.team_rows(c.acme.team)
        _send(client, "post", "/api/v1/templates/", smuggled(c.acme, name="sneak", image="x"))
        assert c.team_rows(c.acme.team) == before


def check_console_templates(c: Checker) -> None:
    """The console's Templates page: Acme's members see Acme's private template; the outsider
    sees only the public one, and editing or deleting either answers 404, changing nothing.
    The offers page filled from Acme's private template (``?template=``) fills nothing."""
    from marketplace.services.templates import template_create

    private = template_create(
        team=c.acme.team, user=None, fields={"name": "acme-secret-tpl", "image": "acme/secret:1"}
    )
    public = template_create(
        team=c.acme.team,
        user=None,
        fields={"name": "acme-open-tpl", "image": "busybox:latest", "public": True},
    )
    for client in c.members():
        page = client.get("/templates/").content.decode()
        assert "acme-secret-tpl" in page and "acme-open-tpl" in page
        assert client.get(f"/templates/{private.pk}/").status_code == 200
    outsider = c.outsider()
    page = outsider.get("/templates/").content.decode()
    assert "acme-secret-tpl" not in page and "acme-open-tpl" in page
    offers = outsider.get(f"/offers/?template={private.hash_id}").content.decode()
    assert "acme/secret:1" not in offers and "renting-from-template" not in offers
    before = c.database()
    with c.capture() as queued:
        for template in (private, public):
            assert outsider.get(f"/templates/{template.pk}/").status_code == 404
            edit = {"name": "sneak", "image": "x:1"}
            assert outsider.post(f"/templates/{template.pk}/", edit).status_code == 404
            assert outsider.post(f"/templates/{template.pk}/delete/").status_code == 404
    assert queued == [] and c.database() == before
    acme_rows = c.team_rows(c.acme.team)
    outsider.post("/templates/", smuggled(c.acme, name="sneak", image="busybox:latest"))
    assert c.team_rows(c.acme.team) == acme_rows


def check_env_vars(c: Checker) -> None:
    """Acme's environment variable: its members see its name (never its value); the outsider
    sees none of Acme's, and changing or deleting it by name answers 404 (v1 and vast.ai)."""
    from marketplace.services.env_vars import env_var_create

    env_var_create(team=c.acme.team, name="ACME_TOKEN", value="acme-s3cret")
    for client in c.members():
        listed = client.get("/api/v1/env-vars/")
        assert [row["name"] for row in listed.json()] == ["ACME_TOKEN"]
        assert "acme-s3cret" not in listed.content.decode()
    for client in c.outsider_api_clients():
        assert "ACME_TOKEN" not in client.get("/api/v1/env-vars/").content.decode()
        assert "ACME_TOKEN" not in client.get("/api/v0/secrets/").content.decode()
        for method, url, data in [
            ("patch", "/api/v1/env-vars/ACME_TOKEN/", {"value": "x"}),
            ("delete", "/api/v1/env-vars/ACME_TOKEN/", None),
            ("put", "/api/v0/secrets/", {"key": "ACME_TOKEN", "value": "x"}),
            ("delete", "/api/v0/secrets/", {"key": "ACME_TOKEN"}),
        ]:
            before = c.database()
            response = _send(client, method, url, data)
            assert response.status_code in (404, 403), (method, url, response.content)
            assert c.database() == before, (method, url)


def check_vast_api_keys(c: Checker) -> None:
    """Acme's API key: not in the outsider's ``show api-keys``; showing or deleting it by id
    answers 404 and it stays unrevoked."""
    key = c.acme.api_key
    for client in c.outsider_api_clients():
        listed = client.get("/api/v0/auth/apikeys/").json().get("apikeys", [])
        assert key.pk not in [row["id"] for row in listed]
        for method in ("get", "delete"):
            before = c.database()
            response = _send(client, method, f"/api/v0/auth/apikeys/{key.pk}/", None)
            assert response.status_code in (404, 403), (method, response.content)
            assert c.database() == before


def check_vast_bulk(c: Checker) -> None:
    """``stop/start/destroy instances`` naming Acme's instance by the outsider (the ids ride in
    the body): 404, nothing done."""
    for method, body in [
        ("put", {"state": "stopped", "ids": [c.acme.instance.pk]}),
        ("put", {"state": "running", "ids": [c.acme.instance.pk]}),
        ("delete", {"instance_ids": [c.acme.instance.pk]}),
    ]:
        for client in c.outsider_api_clients():
            before = c.database()
            with c.capture() as queued:
                response = _send(client, method, "/api/v0/instances/", body)
            assert response.status_code in (401, 404), response.content
            assert queued == [] and c.database() == before


def check_serverless(c: Checker) -> None:
    """Acme's vast.ai endpoint and workergroup (its cluster, workers queued): its members list
    them and read the workers; to the outsider they are in no list, and every path (the
    /api/v0/ ones and the autoscaler's at the site's root) answers 404, changing nothing."""
    from marketplace.services.templates import template_create
    from marketplace.vast.serverless import endpoint_create, workergroup_create

    template = template_create(
        team=c.acme.team, user=None, fields={"name": "acme-worker", "image": "busybox:latest"}
    )
    endpoint = endpoint_create(
        team=c.acme.team, body={"endpoint_name": "acme-llm", "max_workers": 4}
    )
    group = workergroup_create(
        team=c.acme.team,
        body={
            "endpoint_id": endpoint.pk,
            "template_hash": template.hash_id,
            "search_params": "gpu_name=No_Such_GPU",
        },
    )

    def post_json(client, url, data):
        return client.generic("POST", url, json.dumps(data), content_type="application/json")

    for client in c.members():
        assert endpoint.pk in [r["id"] for r in client.get("/api/v0/endptjobs/").json()["results"]]
        assert group.pk in [r["id"] for r in client.get("/api/v0/autojobs/").json()["results"]]
        workers = post_json(client, "/get_endpoint_workers/", {"id": endpoint.pk})
        assert workers.status_code == 200 and len(workers.json()) == 2
    tries = [
        ("put", f"/api/v0/endptjobs/{endpoint.pk}/", {"max_workers": 9}),
        ("delete", f"/api/v0/endptjobs/{endpoint.pk}/", {}),
        ("put", f"/api/v0/autojobs/{group.pk}/", {"search_params": "gpu_name=A100"}),
        ("delete", f"/api/v0/autojobs/{group.pk}/", {}),
        ("post", "/api/v0/autojobs/", {"endpoint_id": endpoint.pk, "template_hash": "x"}),
        ("post", "/get_endpoint_workers/", {"id": endpoint.pk}),
        ("post", "/get_endpoint_logs/", {"id": endpoint.pk}),
        ("post", "/get_autogroup_logs/", {"id": group.pk}),
        ("post", "/update_workers/", {"workergroup_id": group.pk}),
    ]
    for client in c.outsider_api_clients():
        assert "acme-llm" not in client.get("/api/v0/endptjobs/").content.decode()
        assert "acme-llm" not in client.get("/api/v0/autojobs/").content.decode()
        for method, url, data in tries:
            before = c.database()
            with c.capture() as queued:
                response = client.generic(
                    method.upper(), url, json.dumps(data), content_type="application/json"
                )
            assert response.status_code == 404, (method, url, response.content)
            assert queued == [] and c.database() == before, (method, url)


SOME_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@box"

MATRIX: dict[str, list[Check]] = {
    # --- console: accounts and teams
    "console-home": [console_page(lambda w: "/")],
    "team-settings": [console_page(lambda w: "/team/", lambda w: w.member_email)],
    "team-switch": [Custom(check_team_switch)],
    "invitation-create": [Custom(check_invitation_create)],
    "invitation-revoke": [Obj(lambda w: f"/team/invitations/{w.invitation.pk}/revoke/", "post")],
    "member-update": [
        Obj(lambda w: f"/team/members/{w.member.pk}/", "post", {"role": "viewer"}),
        Obj(lambda w: f"/team/members/{w.member.pk}/", "post", {"action": "remove"}),
    ],
    "api-keys": [console_page(lambda w: "/team/api-keys/", lambda w: w.api_key.name)],
    "api-key-revoke": [Obj(lambda w: f"/team/api-keys/{w.api_key.pk}/revoke/", "post")],
    # --- console: renting
    "instances": [console_page(lambda w: "/instances/", instance_link, lambda w: w.instance.image)],
    "instance-detail": [Obj(inst())],
    "instance-logs": [Obj(inst("logs/"))],
    "instance-exec": [Obj(inst("exec/"), "post", {"command": "touch /tmp/pwned"})],
    "instance-action": [
        Obj(inst("stop/"), "post"),
        Obj(inst("start/"), "post"),
        Obj(inst("extend/"), "post", {"hours": "5"}),
        Obj(inst("bid/"), "post", {"bid_price": "0.01"}),
        Obj(inst("pause/"), "post"),
        Obj(inst("continue/"), "post"),
        Obj(inst("restart/"), "post"),
        Obj(inst("new-version/"), "post", {"image": "evil:latest"}),
        Obj(inst("rollback/"), "post", {"version": "1"}),
        Obj(inst("delete-version/"), "post", {"version": "1"}),
        Obj(inst("commit/"), "post", {"repository": "stolen"}),
        Obj(inst("destroy/"), "post"),
    ],
    "deployments": [
        console_page(lambda w: "/deployments/"),
        Custom(check_console_deployments),
    ],
    "deployments-matching": [Custom(check_console_deployments_matching)],
    "clusters": [console_page(lambda w: "/clusters/"), Custom(check_console_clusters)],
    "cluster-detail": [Custom(check_console_clusters)],
    "cluster-action": [Custom(check_console_clusters)],
    "deployment-detail": [Custom(check_console_deployments)],
    "deployment-action": [Custom(check_console_deployments)],
    "deployment-replica-stop": [Custom(check_console_deployments)],
    "ssh-keys": [
        console_page(lambda w: "/ssh-keys/", lambda w: w.ssh_key.name),
        Obj(lambda w: "/ssh-keys/", "post", {"delete": "{ssh_key}"}),
    ],
    # --- console: hosting
    "machines": [console_page(lambda w: "/machines/", lambda w: w.machine.name)],
    "machine-add": [console_page(lambda w: "/machines/add/")],
    "machine-detail": [Obj(mach())],
    "machine-action": [
        Obj(mach("confirm/"), "post", {"fingerprint": "SHA256:acme-offered"}),
        Obj(mach("terms/"), "post", {"price": "9.99", "storage_price": "1", "min_gpus": "1"}),
        Obj(mach("firewall/"), "post", {"blocked_ranges": "10.0.0.0/8"}),
        Obj(mach("list/"), "post"),
        Obj(mach("unlist/"), "post"),
        Obj(mach("probe/"), "post"),
        Obj(mach("reconnect/"), "post"),
        Obj(mach("self-test/"), "post"),
        Obj(
            mach("maintenance/"),
            "post",
            {"starts_at": "2031-01-01T10:00", "ends_at": "2031-01-01T12:00"},
        ),
        Obj(mach("maintenance-cancel/"), "post", {"window": "{window}"}),
        Obj(mach("remove/"), "post"),
    ],  # fmt: skip
    # --- console: billing
    # The console names the rental and links to it (the reference is the export's and API's).
    "billing-balance": [console_page(lambda w: "/billing/", instance_link)],
    "billing-ledger-csv": [Page(lambda w: "/billing/ledger.csv", lambda w: [rental_reference(w)])],
    "billing-invoices": [console_page(lambda w: "/billing/invoices/")],
    "billing-invoice": [console_page(lambda w: f"/billing/invoices/{w.month}/", rental_reference)],
    "billing-invoice-pdf": [
        Page(
            lambda w: f"/billing/invoices/{w.month}/pdf/",
            lambda w: [w.team.name, rental_reference(w)],
        )
    ],
    "billing-topup-return": [Obj(lambda w: f"/billing/topup/return/?session_id=cs_test_{w.tag}")],
    "earnings": [
        console_page(lambda w: "/earnings/", lambda w: f'href="/machines/{w.machine.pk}/"')
    ],
    "payouts": [
        console_page(lambda w: "/payouts/", payout_row),
        Custom(check_console_payout_ask),
    ],
    "payout-cancel": [Obj(lambda w: f"/payouts/{w.payout.pk}/cancel/", "post")],
    # --- API: who am I, team
    "api-me": [Custom(check_me)],
    "api-member-list": [Listing(lambda w: "/api/v1/team/members/", lambda w: [w.member.pk])],
    "api-member-detail": [
        Obj(lambda w: f"/api/v1/team/members/{w.member.pk}/"),
        Obj(lambda w: f"/api/v1/team/members/{w.member.pk}/", "patch", {"role": "viewer"}),
        Obj(lambda w: f"/api/v1/team/members/{w.member.pk}/", "delete"),
    ],
    "api-invitation-list": [
        Listing(lambda w: "/api/v1/team/invitations/", lambda w: [w.invitation.pk]),
        Creates(
            lambda w: "/api/v1/team/invitations/",
            lambda w: smuggled(w, email="sneak@example.com", role="owner"),
        ),
    ],
    "api-invitation-detail": [
        Obj(lambda w: f"/api/v1/team/invitations/{w.invitation.pk}/", "delete")
    ],
    "api-apikey-list": [
        Listing(lambda w: "/api/v1/api-keys/", lambda w: [w.api_key.pk]),
        Creates(lambda w: "/api/v1/api-keys/", lambda w: smuggled(w, name="sneak", access="write")),
    ],
    "api-apikey-detail": [
        Obj(lambda w: f"/api/v1/api-keys/{w.api_key.pk}/"),
        Obj(lambda w: f"/api/v1/api-keys/{w.api_key.pk}/", "delete"),
    ],
    # --- API: renting
    "api-instance-list": [
        Listing(lambda w: "/api/v1/instances/", lambda w: [w.instance.pk]),
        Creates(
            lambda w: "/api/v1/instances/",
            lambda w: smuggled(
                w, machine_id=w.machine.pk, num_gpus=1, image="busybox", duration_hours=1
            ),
        ),
    ],
    "api-instance-detail": [
        Obj(api_inst()),
        Obj(api_inst(), "patch", {"env": {"PWNED": "1"}}),
        Obj(api_inst(), "delete"),
    ],
    "api-instance-versions": [Obj(api_inst("versions/"))],
    "api-instance-rollback": [Obj(api_inst("rollback/"), "post", {"version": 1})],
    "api-instance-version": [Obj(api_inst("versions/1/"), "delete")],
    "api-instance-commit": [
        Obj(api_inst("commit/"), "post", {"repository": "stolen", "tag": "v1"})
    ],
    "api-deployment-list": [Custom(check_deployments)],
    "api-cluster-list": [Custom(check_clusters)],
    "api-cluster-detail": [Custom(check_clusters)],
    "api-cluster-scale": [Custom(check_clusters)],
    "api-cluster-endpoint": [Custom(check_clusters)],
    "api-cluster-stop": [Custom(check_clusters)],
    "api-cluster-resume": [Custom(check_clusters)],
    "api-cluster-extend": [Custom(check_clusters)],
    "api-cluster-replicas": [Custom(check_clusters)],
    "gateway-auth": [Custom(check_gateway_auth)],
    "volumes": [console_page(lambda w: "/volumes/"), Custom(check_volumes)],
    "machine-usage": [Custom(check_machine_usage)],
    "api-machine-gpus": [Custom(check_machine_usage)],
    "api-machine-ports": [Custom(check_machine_usage)],
    "api-volume-list": [Custom(check_volumes)],
    "api-image-list": [Custom(check_committed_images)],
    "api-volume-detail": [Custom(check_volumes)],
    "api-volume-versions": [Custom(check_volumes)],
    "vast-volumes": [Custom(check_volumes)],
    "vast-team-members": [Listing(lambda w: "/api/v0/team/members/", lambda w: [w.member.user_id])],
    "vast-team-member": [Obj(lambda w: f"/api/v0/team/members/{w.member.user_id}/", "delete")],
    "vast-team-invite": [
        Creates(lambda w: "/api/v0/team/invite/?email=new-one@example.com", lambda w: smuggled(w))
    ],
    "vast-transfer-credit": [Custom(check_transfer_credit)],
    "api-volume-usage": [Custom(check_volumes)],
    "api-volume-extend": [Custom(check_volumes)],
    "api-volume-clone": [Custom(check_volumes)],
    "vast-volume-clone": [Custom(check_volumes)],
    "vast-copy-rsync": [Custom(check_copy)],
    "vast-copy-direct": [Custom(check_copy)],
    "api-deployment-detail": [Custom(check_deployments)],
    "api-deployment-stop": [Custom(check_deployments)],
    "api-deployment-replicas": [Custom(check_deployments)],
    "api-deployment-replica-stop": [Custom(check_deployments)],
    "api-instance-stop": [Obj(api_inst("stop/"), "post")],
    "api-instance-start": [Obj(api_inst("start/"), "post")],
    "api-instance-pause": [Obj(api_inst("pause/"), "post")],
    "api-instance-continue": [Obj(api_inst("continue/"), "post")],
    "api-instance-restart": [Obj(api_inst("restart/"), "post")],
    "api-instance-extend": [Obj(api_inst("extend/"), "post", {"hours": 5})],
    "api-instance-label": [Obj(api_inst("label/"), "post", {"label": "theirs now"})],
    "api-instance-bid": [Obj(api_inst("bid/"), "put", {"bid_price": "0.01"})],
    "api-instance-logs": [Obj(api_inst("logs/"))],
    "api-instance-exec-command": [Obj(api_inst("exec/"), "post", {"command": "id"})],
    "api-sshkey-list": [
        Listing(lambda w: "/api/v1/ssh-keys/", lambda w: [w.ssh_key.pk]),
        Creates(
            lambda w: "/api/v1/ssh-keys/",
            lambda w: smuggled(w, name="sneak", public_key=public_key()),
        ),
    ],
    "api-sshkey-detail": [Obj(lambda w: f"/api/v1/ssh-keys/{w.ssh_key.pk}/", "delete")],
    # --- API: hosting
    "api-machine-list": [
        Listing(lambda w: "/api/v1/machines/", lambda w: [w.machine.pk]),
        Creates(lambda w: "/api/v1/machines/", lambda w: smuggled(w, address="192.0.2.99")),
    ],
    "api-machine-detail": [Obj(api_mach()), Obj(api_mach(), "delete")],
    "api-machine-confirm": [
        Obj(api_mach("confirm/"), "post", {"fingerprint": "SHA256:acme-offered"})
    ],
    "api-machine-probe": [Obj(api_mach("probe/"), "post")],
    "api-machine-reconnect": [Obj(api_mach("reconnect/"), "post")],
    "api-machine-self-test": [Obj(api_mach("self-test/"), "post")],
    "api-machine-events": [Obj(api_mach("events/"))],
    "api-machine-history": [Obj(api_mach("history/"))],
    "api-machine-earnings": [Obj(api_mach("earnings/"))],
    "api-machine-terms": [
        Obj(
            api_mach("terms/"),
            "put",
            {"price_per_gpu_hour": "9.00", "storage_price_per_gb_month": "0.000001"},
        )
    ],  # fmt: skip
    "api-machine-listing": [Obj(api_mach("listing/"), "put", {"listed": False})],
    "api-machine-sharing": [Obj(api_mach("sharing/"), "put", {"enabled": False})],
    "api-machine-maintenance": [
        Obj(api_mach("maintenance/")),
        Obj(
            api_mach("maintenance/"),
            "post",
            {"starts_at": "2031-01-01T10:00:00Z", "ends_at": "2031-01-01T12:00:00Z"},
        ),
    ],  # fmt: skip
    "api-machine-maintenance-cancel": [
        Obj(lambda w: f"/api/v1/machines/{w.machine.pk}/maintenance/{w.window.pk}/", "delete")
    ],
    # --- API: billing
    "billing-balance-list": [Custom(check_balance)],
    "billing-ledger-list": [Listing(lambda w: "/api/v1/billing/ledger/", lambda w: [w.entry.pk])],
    "billing-ledger-detail": [Obj(lambda w: f"/api/v1/billing/ledger/{w.entry.pk}/")],
    "billing-hold-list": [Listing(lambda w: "/api/v1/billing/holds/", lambda w: [w.hold.pk])],
    "billing-hold-detail": [Obj(lambda w: f"/api/v1/billing/holds/{w.hold.pk}/")],
    "billing-topup-list": [
        Listing(lambda w: "/api/v1/billing/topups/", lambda w: [w.topup.pk]),
        Creates(
            lambda w: "/api/v1/billing/topups/",
            lambda w: smuggled(
                w,
                amount_usd="25.00",
                success_url="https://example.com/ok",
                cancel_url="https://example.com/cancel",
            ),  # fmt: skip
        ),
    ],
    "billing-topup-detail": [Obj(lambda w: f"/api/v1/billing/topups/{w.topup.pk}/")],
    "billing-invoice-list": [
        Listing(lambda w: "/api/v1/billing/invoices/", invoice_totals, key="total")
    ],
    "billing-invoice-detail": [
        Listing(
            lambda w: f"/api/v1/billing/invoices/{w.month}/",
            lambda w: [rental_reference(w)],
            key="reference",
        )
    ],
    "api-payout-list": [
        Listing(lambda w: "/api/v1/payouts/", lambda w: [w.payout.pk]),
        Creates(lambda w: "/api/v1/payouts/", lambda w: smuggled(w, amount="0.02")),
    ],
    # Decided by the operator; the team may only cancel one that waits.
    "api-payout-detail": [Obj(lambda w: f"/api/v1/payouts/{w.payout.pk}/")],
    "api-payout-cancel": [Obj(lambda w: f"/api/v1/payouts/{w.payout.pk}/cancel/", "post")],
    "billing-earnings-list": [
        Listing(
            lambda w: "/api/v1/billing/earnings/",
            lambda w: [machine_reference(w)],
            key="machine_reference",
        )
    ],
    # --- the vast.ai-compatible API (/api/v0/)
    "vast-user": [Page(lambda w: "/api/v0/users/current", lambda w: [w.team.name])],
    "vast-invoices": [
        Listing(lambda w: "/api/v0/users/me/invoices", lambda w: [rental_reference(w)], "reference")
    ],
    "vast-charges": [
        Listing(
            lambda w: f"/api/v0/charges/?{ALL_DAYS}", lambda w: [rental_reference(w)], "reference"
        )
    ],
    "vast-invoice-search": [Listing(lambda w: "/api/v0/invoices", credit_entry_ids)],
    "vast-invoices-v1": [Listing(lambda w: f"/api/v1/invoices/?{ALL_WHENS}", credit_entry_ids)],
    "vast-deposit": [Obj(lambda w: f"/api/v0/instances/balance/{w.instance.pk}/")],
    "vast-instance-update": [
        Obj(
            lambda w: f"/api/v0/instances/update_template/{w.instance.pk}/",
            "put",
            {"image": "gpumkt/busybox:latest"},
        )
    ],
    "vast-instances": [
        Listing(lambda w: "/api/v0/instances/?owner=me", lambda w: [w.instance.pk]),
        Custom(check_vast_bulk),
    ],
    "vast-templates": [Custom(check_templates)],
    "templates": [Custom(check_console_templates)],
    "template-edit": [Custom(check_console_templates)],
    "template-delete": [Custom(check_console_templates)],
    "vast-endpoints": [Custom(check_serverless)],
    "vast-endpoint": [Custom(check_serverless)],
    "vast-workergroups": [Custom(check_serverless)],
    "vast-workergroup": [Custom(check_serverless)],
    "vast-endpoint-workers": [Custom(check_serverless)],
    "vast-endpoint-logs": [Custom(check_serverless)],
    "vast-workergroup-logs": [Custom(check_serverless)],
    "vast-update-workers": [Custom(check_serverless)],
    "vast-machine": [Obj(lambda w: f"/api/v0/machines/{w.machine.pk}")],
    "vast-maintenances": [
        Obj(lambda w: f"/api/v0/machines/maintenances?owner=me&machine_ids=[{w.machine.pk}]")
    ],
    "vast-machine-cancel-maintenance": [
        Obj(lambda w: f"/api/v0/machines/{w.machine.pk}/cancel_maint/", "put")
    ],
    "vast-machine-min-bid": [
        Obj(lambda w: f"/api/v0/machines/{w.machine.pk}/minbid/", "put", {"price": 0.01})
    ],
    "vast-machine-delete": [
        Obj(lambda w: f"/api/v0/machines/{w.machine.pk}/force_delete/", "post")
    ],
    "vast-machine-reports": [Obj(lambda w: f"/api/v0/machines/{w.machine.pk}/reports/")],
    "vast-instance-ssh": [
        Obj(lambda w: f"/api/v0/instances/{w.instance.pk}/ssh/", "post", {"ssh_key": SOME_KEY})
    ],
    "vast-instance-ssh-key": [
        Obj(lambda w: f"/api/v0/instances/{w.instance.pk}/ssh/{w.ssh_key.pk}/", "delete")
    ],
    "api-instance-attach-ssh-key": [
        Obj(
            lambda w: f"/api/v1/instances/{w.instance.pk}/ssh-keys/",
            "post",
            {"public_key": SOME_KEY},
        )
    ],
    "api-instance-detach-ssh-key": [
        Obj(lambda w: f"/api/v1/instances/{w.instance.pk}/ssh-keys/{w.ssh_key.pk}/", "delete")
    ],
    "vast-env-vars": [Custom(check_env_vars)],
    "api-env-vars": [Custom(check_env_vars)],
    "api-env-var": [Custom(check_env_vars)],
    "vast-api-keys": [Custom(check_vast_api_keys)],
    "vast-api-key": [Custom(check_vast_api_keys)],
    "vast-template-v1": [Custom(check_templates)],
    "api-template-list": [Custom(check_templates)],
    "api-template-detail": [Custom(check_templates)],
    "api-template-rent": [Custom(check_templates)],
    "vast-instance": [
        Obj(lambda w: f"/api/v0/instances/{w.instance.pk}/"),
        Obj(lambda w: f"/api/v0/instances/{w.instance.pk}/", "put", {"state": "stopped"}),
        Obj(lambda w: f"/api/v0/instances/{w.instance.pk}/", "put", {"state": "running"}),
        Obj(lambda w: f"/api/v0/instances/{w.instance.pk}/", "delete"),
    ],
    "vast-instance-logs": [
        Obj(lambda w: f"/api/v0/instances/request_logs/{w.instance.pk}/", "put")
    ],
    "vast-instance-reboot": [Obj(lambda w: f"/api/v0/instances/reboot/{w.instance.pk}/", "put")],
    "vast-instance-bid": [
        Obj(lambda w: f"/api/v0/instances/bid_price/{w.instance.pk}/", "put", {"price": 0.01})
    ],
    "vast-instance-command": [
        Obj(
            lambda w: f"/api/v0/instances/command/{w.instance.pk}/",
            "put",
            {"command": "touch /tmp/pwned"},
        )
    ],
    "vast-ssh-keys": [Listing(lambda w: "/api/v0/ssh/", lambda w: [w.ssh_key.pk])],
    "vast-ssh-key": [
        Obj(lambda w: f"/api/v0/ssh/{w.ssh_key.pk}/", "delete"),
        Obj(lambda w: f"/api/v0/ssh/{w.ssh_key.pk}/", "put", {"ssh_key": SOME_KEY}),
    ],
    "vast-machines": [Listing(lambda w: "/api/v0/machines?owner=me", lambda w: [w.machine.pk])],
    "vast-machine-list": [Custom(check_vast_list_machine)],
    "vast-machine-unlist": [Obj(lambda w: f"/api/v0/machines/{w.machine.pk}/asks/", "delete")],
    "vast-machine-maintenance": [
        Obj(
            lambda w: f"/api/v0/machines/{w.machine.pk}/dnotify/",
            "put",
            {"sdate": 2_000_000_000, "duration": 1},
        )
    ],
    "vast-earnings": [
        Listing(
            lambda w: "/api/v0/users/me/machine-earnings",
            lambda w: [machine_reference(w)],
            key="key",
        )
    ],
}

# Routes with no team object to reach, each with the reason.
EXEMPT: dict[str, str] = {
    "vast-price-increases": "always the empty list: a rental's prices are fixed at renting",
    "vast-price-increase-answer": "answers 'none pending' to any id; reads and changes nothing",
    "login": "anonymous sign-in form; no team data",
    "logout": "ends the caller's own session",
    "signup": "anonymous; makes a new user and their personal team",
    "team-create": "makes a new team owned by the caller; takes no other team's id",
    "invitation-accept": "a bearer link; acceptance checks the email "
    "(test_invitation_for_another_email_is_refused)",
    "offers": "the public market: every team sees every listed machine by design",
    "rent": "renting another team's listed machine is the product (tests/marketplace/test_rentals)",
    "billing-topup": "acts for the caller's active team only; takes no object id",
    "billing-topup-cancel": "a redirect with a message; reads nothing",
    "billing-test-credit": "DEBUG only; credits the caller's active team",
    "stripe-webhook": "Stripe-signed and sessionless (tests/billing)",
    "api-offers": "the public market, as the console's offers page",
    "api-offer-quote": "the price of a public offer",
    "api-offer-figures": "a public offer's measured figures; listed machines only "
    "(tests/hosts/test_verification.py)",
    "offer-figures": "a public offer's measured figures, as api-offer-figures",
    "api-schema": "the API's description; no data",
    "api-docs": "the API's description; no data",
    "api-root": "DRF's index of endpoints; no data",
    "api-machine-platform-key": "the platform's public SSH key, the same for every team",
    "healthz": "probe; answers alive and reads nothing",
    "favicon": "a redirect to the site's icon; no data",
    "readyz": "probe; names which dependency is down, no team data",
    "metrics": "operators only (METRICS_TOKEN bearer or staff session); 404 to everyone else "
    "(tests/observability)",
    "operator": "staff only, site-wide operator view; 404 to everyone else (tests/observability)",
    "vast-schema": "the vast.ai API's description; no data",
    "vast-bundles": "the public market through the vast.ai API, as api-offers",
    "vast-ask": "renting another team's listed machine is the product, as rent "
    "(tests/vast/test_translation.py)",
    "vast-asks-bulk": "renting other teams' listed machines is the product, as vast-ask "
    "(tests/vast/test_bulk.py)",
    "vast-team": "makes a new team owned by the caller (as team-create); destroy team is "
    "refused to everyone",
    "vast-team-roles": "the four fixed roles, the same for every team; creating one is refused",
    "vast-team-roles-full": "the four fixed roles, the same for every team",
    "vast-team-role": "one of the four fixed roles; changing or removing one is refused",
    "vast-launch": "search and rent in one call: renting another team's listed machine is the "
    "product, as vast-ask (tests/vast/test_launch.py)",
    "vast-volume-search": "the public market of volume offers (listed machines' free disk), "
    "as vast-bundles",
}
# Unnamed routes, by pattern.
EXEMPT_UNNAMED: dict[str, str] = {
    r"api/v1/^.*$": "the API's JSON 404 for unknown endpoints",
    r"^api(/.*)?$": "the API's JSON 404 outside /api/v1/",
    r"api/v0/^.*$": "the vast.ai API's JSON 404 for commands it does not offer",
    r"api/v0/^tfa/": "the same 404 for two-factor commands, its error a code the CLI reads",
}


# --- running the checks ----------------------------------------------------------------------


def _all_models():
    for label in ("marketplace", "scheduler", "hosts", "billing"):
        yield from apps.get_app_config(label).get_models()


VOLATILE = {"last_used_at"}  # touched by the outsider's own key on every request


@dataclass
class Checker:
    acme: World
    theirs: World
    owner_user: object
    teammate_user: object
    outsider_user: object
    capture: Callable
    outsider_key: str = ""

    def session(self, user, team: Team | None = None) -> Client:
        return client_for(Client(), user, team)

    def outsider(self) -> Client:
        return self.session(self.outsider_user)

    def outsider_api_clients(self) -> list[Client]:
        keyed = Client(HTTP_AUTHORIZATION=f"Bearer {self.outsider_key}")
        return [self.outsider(), keyed]

    def members(self) -> list[Client]:
        return [
            self.session(self.owner_user, self.acme.team),
            self.session(self.teammate_user, self.acme.team),
        ]

    @staticmethod
    def rows(queryset) -> list[dict]:
        return [
            {k: v for k, v in row.items() if k not in VOLATILE}
            for row in queryset.order_by("pk").values()
        ]

    def database(self) -> dict[str, list[dict]]:
        return {model._meta.label: self.rows(model.objects.all()) for model in _all_models()}

    def team_rows(self, team: Team) -> dict[str, list[dict]]:
        """Every row that belongs to ``team`` (models with a ``team`` field)."""
        return {
            model._meta.label: self.rows(model.objects.filter(team=team))
            for model in _all_models()
            if any(f.name == "team" for f in model._meta.get_fields())
        }


def _send(client: Client, method: str, url: str, data: dict | None):
    if url.startswith("/api/"):
        body = json.dumps(data or {})
        return client.generic(method.upper(), url, body, content_type="application/json")
    if method == "get":
        return client.get(url)
    return client.post(url, data or {})


def _content(response) -> str:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode()
    if response.get("Content-Type") == "application/pdf":  # the text a reader sees in it
        pages = pypdf.PdfReader(io.BytesIO(response.content)).pages
        return " ".join(" ".join(page.extract_text().split()) for page in pages)  # unwrapped
    return response.content.decode()


def _fill(data: dict | None, w: World) -> dict | None:
    """Form values that name one of the world's objects: {"delete": "{ssh_key}"}."""
    if data is None:
        return None
    refs = {"{ssh_key}": str(w.ssh_key.pk), "{window}": str(w.window.pk)}
    return {k: refs.get(v, v) if isinstance(v, str) else v for k, v in data.items()}


def _rows(body) -> list[dict]:
    if isinstance(body, dict):
        for key in (
            "results",
            "lines",
            "by_machine",
            "invoices",
            "machines",
            "per_machine",
            "instances",
        ):
            if key in body:
                return body[key]
        return [body]
    return body


def _has(text: str, marker: str) -> bool:
    """``marker`` in the text, not as the start of a longer number (rental:1 vs rental:12).
    A space may stand between two of its characters: a PDF's text, as pypdf extracts it,
    splits a word where the layout leaves a wider gap between two glyphs ("rental: 1" on one
    day's invoice, "rental:1" on another's, the same to a reader)."""

    def spaced(form: str) -> str:
        return r"\s?".join(re.escape(character) for character in form) + r"(?!\s?\d)"

    return any(re.search(spaced(form), text) for form in {marker, escape(marker)})


def _session_only(url: str) -> bool:
    from django.urls import resolve

    callback = resolve(url.split("?")[0]).func
    return getattr(getattr(callback, "cls", None), "session_only", False)


def run_check(c: Checker, check: Check) -> None:
    acme, theirs = c.acme, c.theirs
    if isinstance(check, Custom):
        check.run(c)
    elif isinstance(check, Page):
        for client in c.members():
            response = client.get(check.url(acme))
            assert response.status_code == 200, check.url(acme)
            text = _content(response)
            assert all(_has(text, m) for m in check.markers(acme)), check.markers(acme)
        response = c.outsider().get(check.url(theirs))
        assert response.status_code == 200
        text = _content(response)
        assert all(_has(text, m) for m in check.markers(theirs)), check.markers(theirs)
        leaked = [m for m in check.markers(acme) if _has(text, m)]
        assert not leaked, f"{check.url(theirs)} shows the outsider Acme's {leaked}"
    elif isinstance(check, Creates):
        # The outsider's own world is the target; Acme's id rides along in the body.
        for client in c.outsider_api_clients():
            before = c.team_rows(acme.team)
            with c.capture():
                response = _send(client, "post", check.url(theirs), check.data(acme))
            assert response.status_code != 500, (check.url(theirs), response.content)
            assert c.team_rows(acme.team) == before, f"POST {check.url(theirs)} wrote for Acme"
    elif isinstance(check, Listing):
        for client in c.members():
            response = client.get(check.url(acme))
            assert response.status_code == 200, (check.url(acme), response.content)
            found = [row[check.key] for row in _rows(response.json())]
            assert set(check.ids(acme)) <= set(found), (check.url(acme), found)
        for client in c.outsider_api_clients():
            response = client.get(check.url(theirs))
            if response.status_code == 403 and _session_only(check.url(theirs)):
                continue  # a key may not list this at all
            assert response.status_code == 200, (check.url(theirs), response.content)
            found = [row[check.key] for row in _rows(response.json())]
            assert set(check.ids(theirs)) <= set(found)
            assert not set(check.ids(acme)) & set(found), f"{check.url(theirs)} leaks Acme's ids"
    else:
        url = check.url(acme)
        data = _fill(check.data, acme)
        if check.method == "get":
            for client in c.members():
                response = _send(client, "get", url, None)
                assert response.status_code == 200, (url, response.status_code)
        clients = c.outsider_api_clients() if url.startswith("/api/") else [c.outsider()]
        for client in clients:
            before = c.database()
            with c.capture() as queued:
                response = _send(client, check.method, url, data)
            keyed = "HTTP_AUTHORIZATION" in client.defaults
            expected = {404, 403} if keyed and _session_only(url) else {404}
            assert response.status_code in expected, (check.method, url, response.status_code)
            if url.startswith("/api/"):
                assert response.json()["error"]["code"] in ("not_found", "permission_denied")
            assert queued == [], f"{check.method} {url} queued work for the outsider"
            assert c.database() == before, f"{check.method} {url} changed the database"


@pytest.fixture
def checker(worlds, owner, teammate, outsider, django_capture_on_commit_callbacks) -> Checker:
    own = Membership.objects.get(user=outsider, team=worlds.theirs.team)
    key = api_key_create(
        membership=own, name="outsider bot", access=ApiKey.Access.WRITE,
        audience=ApiKey.Audience.ALL,
    )  # fmt: skip
    return Checker(
        acme=worlds.acme,
        theirs=worlds.theirs,
        owner_user=owner,
        teammate_user=teammate,
        outsider_user=outsider,
        capture=django_capture_on_commit_callbacks,
        outsider_key=key.secret,
    )


@pytest.mark.parametrize("route", sorted(MATRIX))
def test_tenancy(route, checker):
    for check in MATRIX[route]:
        run_check(checker, check)


# --- the route list comes from the URL conf --------------------------------------------------


def _routes(patterns=None, prefix: str = "", namespace: str | None = None):
    for pattern in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(pattern, URLResolver):
            yield from _routes(
                pattern.url_patterns, prefix + str(pattern.pattern), pattern.namespace or namespace
            )
        elif isinstance(pattern, URLPattern):
            yield namespace, pattern.name, prefix + str(pattern.pattern), pattern.callback


def _tried_methods(route: str) -> set[str]:
    checks = MATRIX.get(route, [])
    return (
        {c.method for c in checks if isinstance(c, Obj)}
        | {"get" for c in checks if isinstance(c, Page | Listing)}
        | {"post" for c in checks if isinstance(c, Creates)}
    )


def test_every_route_is_in_the_matrix():
    uncovered, unnamed, untried = set(), set(), {}
    for namespace, name, pattern, callback in _routes():
        if namespace == "admin":
            continue  # Django's admin: staff only, its own permissions
        if name is None:
            if pattern not in EXEMPT_UNNAMED:
                unnamed.add(pattern)
            continue
        if name not in MATRIX and name not in EXEMPT:
            uncovered.add(f"{name} ({pattern})")
            continue
        # A viewset route lists its methods: each one must be tried (or the route exempt).
        actions = getattr(callback, "actions", None) or {}
        if name in MATRIX and actions and not any(isinstance(c, Custom) for c in MATRIX[name]):
            allowed = set(callback.cls.http_method_names) - {"options", "head", "trace"}
            missing = (set(actions) & allowed) - _tried_methods(name)
            if missing:
                untried[name] = sorted(missing)
    assert not uncovered, f"routes uncovered yet (add cases or an exemption): {sorted(uncovered)}"
    assert not unnamed, f"unnamed routes uncovered yet: {sorted(unnamed)}"
    assert not untried, f"methods the matrix does not try: {untried}"
    names = {name for _, name, _, _ in _routes()}
    assert not (set(MATRIX) | set(EXEMPT)) - names, "stale matrix entries"


# WebSocket routes (marketplace/routing.py), each with the test that shows another team's
# subscription is refused before accept.
WEBSOCKET_TENANCY: dict[str, str] = {
    "ws/events/": "tests.marketplace.test_websocket:test_member_receives_own_team_events_only",
    "ws/instances/<id:instance_id>/": (
        "tests.marketplace.test_websocket:test_instance_socket_is_refused_for_another_teams_instance"
    ),
    # Every other path: closed with 4404, whoever asks (it serves nothing of any team).
    "": (
        "tests.marketplace.test_hostile_sockets:"
        "test_another_teams_instance_and_a_missing_one_close_alike_with_4404"
    ),
}


def test_every_websocket_route_has_a_tenancy_test():
    from marketplace.routing import websocket_urlpatterns

    routes = {str(pattern.pattern) for pattern in websocket_urlpatterns}
    uncovered = routes - set(WEBSOCKET_TENANCY)
    assert not uncovered, f"WebSocket routes uncovered yet: {sorted(uncovered)}"
    assert not set(WEBSOCKET_TENANCY) - routes, "stale WebSocket entries"
    for reference in WEBSOCKET_TENANCY.values():
        module, name = reference.split(":")
        assert callable(getattr(importlib.import_module(module), name, None)), reference
