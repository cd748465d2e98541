"""The console's Deployments pages, as a team member uses them: create from the form (a replica
placed on a simulated host), refusals that name the field and write nothing, the replicas
table (live through its partial), scale, stop, stop one replica, and another team's 404."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.html import escape

from hosts.models import Gpu, Machine
from marketplace.deployments.services import DeploymentSpec, deployment_create
from marketplace.models import Deployment, Replica, Role
from marketplace.services.offers import offer_refresh
from tests.conftest import client_for
from tests.factories import UserFactory, add_member
from tests.marketplace.conftest import machine_for

# Exits at once on `docker stop` (a bare `sleep` as PID 1 ignores SIGTERM for 10 s).
FORM = {
    "name": "web", "mode": "replicaset", "image": "gpumkt/busybox:latest",
    "launch_mode": "entrypoint", "entrypoint": "sh",
    "args": "-c 'trap \"exit 0\" TERM; while :; do sleep 1; done'",
    "gpu_names": "RTX 4090", "gpus_per_replica": "1", "replicas": "1", "completions": "1",
    "max_price_per_gpu_hour": "", "regions": "", "min_reliability": "0", "policy": "binpack",
    "duration_hours": "1", "budget_usd": "", "disk_gb": "50", "backoff_limit": "6",
}  # fmt: skip


@pytest.fixture
def console(client, owner, funded_team):
    return client_for(client, owner, funded_team)


def shown(response) -> str:
    return html.unescape(response.content.decode())


def page_messages(response) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'<li class="message [^"]*">(.*?)</li>',
                                                   response.content.decode())]  # fmt: skip


def replica_states(response) -> dict[int, str]:
    """The replicas table as shown: replica id → the state in its badge."""
    rows = re.findall(
        r'<tr data-replica="(\d+)">.*?data-state="(\w+)"', response.content.decode(), re.S
    )
    return {int(pk): state for pk, state in rows}


def queued_deployment(team, **spec) -> Deployment:
    """A deployment no machine can take (none is listed): its replicas stay queued."""
    values = {"name": "batch", "image": "busybox:latest", "gpu_names": ["RTX 4090"], **spec}
    return deployment_create(team=team, spec=DeploymentSpec(**values))


# --- on a simulated host ---------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_create_from_the_form_places_a_replica_then_scale_and_stop(
    console, provider_team, sim_host_factory
):
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    response = console.post("/deployments/", FORM, follow=True)
    deployment = Deployment.objects.get()
    assert response.redirect_chain == [(f"/deployments/{deployment.pk}/", 302)]
    assert page_messages(response) == [
        "Deployment web created. Its replicas update here by themselves."
    ]
    assert (deployment.gpu_names, deployment.policy, deployment.args[0]) == (
        ["RTX 4090"],
        "binpack",
        "-c",
    )
    replica = deployment.replicas.get()
    assert replica_states(response) == {replica.pk: "running"}
    page = shown(response)
    assert re.search(r'<small class="uptime">up \d+.minutes?</small>', page), "uptime"
    assert f'href="/instances/{replica.instance_id}/"' in page
    assert replica.instance.machine_id == machine.pk and replica.instance.container_name in page
    assert f"<td>{escape(machine.name)}</td>" in page  # the machine by name, not its id
    assert 'id="queue-reason"' not in page
    # The list shows it with its counts.
    listed = shown(console.get("/deployments/"))
    assert f'<a href="/deployments/{deployment.pk}/">web</a>' in listed
    assert "No deployments yet" not in listed

    scaled = console.post(f"/deployments/{deployment.pk}/scale/", {"replicas": "2"}, follow=True)
    assert page_messages(scaled) == ["Scaled to 2 replicas."]
    assert list(replica_states(scaled).values()) == ["running", "running"]

    one = console.post(f"/deployments/{deployment.pk}/replicas/{replica.pk}/stop/", follow=True)
    assert page_messages(one) == [f"Replica {replica.pk} stopped; its rental is destroyed."]
    assert replica_states(one)[replica.pk] == "stopped"

    stopped = console.post(f"/deployments/{deployment.pk}/stop/", follow=True)
    assert page_messages(stopped)[0].startswith("Stopped: every replica's rental is destroyed")
    assert set(replica_states(stopped).values()) == {"stopped"}
    assert '<div class="stat small" id="deployment-state">stopped</div>' in shown(stopped)
    assert 'id="scale-button"' not in shown(stopped) and 'id="stop-button"' not in shown(stopped)
    assert {r.instance.state for r in deployment.replicas.all()} == {"destroyed"}


# --- without hosts ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_empty_list_says_what_to_do_and_the_nav_links_here(console):
    page = shown(console.get("/deployments/"))
    assert "No deployments yet — create one below" in page
    assert '<a href="/deployments/" class="active">Deployments</a>' in page
    assert 'name="gpu_names"' in page and 'name="budget_usd"' in page
    # Disk and backoff limit, with their defaults, and the live match count.
    assert 'name="disk_gb" type="number" min="1" value="50"' in page
    assert 'name="backoff_limit" type="number" min="0" value="6"' in page
    assert 'hx-get="/deployments/matching/"' in page and 'id="matching-count"' in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("gpus_per_replica", "0", "gpus per replica: Ensure this value is greater than or equal to 1."),
        ("replicas", "two", "replicas: A valid integer is required."),
        ("budget_usd", "-5", "budget usd:"),
        ("max_price_per_gpu_hour", "cheap", "max price per gpu hour:"),
        ("min_reliability", "1.5", "min reliability: Ensure this value is less than or equal to 1."),
        ("name", "", "name: This field may not be blank."),
        ("ports", "80, x", "ports: 'x' is not a port number."),
        ("mode", "daemon", "mode:"),
    ],
)  # fmt: skip
def test_a_bad_field_is_a_message_naming_it_and_writes_nothing(console, field, value, message):
    response = console.post("/deployments/", {**FORM, field: value})
    assert response.status_code == 400
    [said] = page_messages(response)
    assert said.startswith(f"Could not create the deployment: {message}"), said
    assert not Deployment.objects.exists() and not Replica.objects.exists()
    # The form keeps what was typed.
    assert 'value="gpumkt/busybox:latest"' in response.content.decode()


@pytest.mark.django_db
def test_the_detail_page_lists_replicas_with_the_queue_reason_and_polls_its_partial(
    console, funded_team
):
    deployment = queued_deployment(funded_team, replica_count=2)
    response = console.get(f"/deployments/{deployment.pk}/")
    assert response.status_code == 200
    page = shown(response)
    assert list(replica_states(response).values()) == ["queued", "queued"]
    assert (
        '<div class="message warning" id="queue-reason"><strong>Queued:</strong> '
        "no RTX 4090 with 1 free GPU; no listed machine has RTX 4090</div>"
    ) in page
    assert f'hx-get="/deployments/{deployment.pk}/" hx-trigger="every 3s' in page
    partial = console.get(f"/deployments/{deployment.pk}/", HTTP_HX_REQUEST="true")
    assert "<html" not in partial.content.decode()
    assert list(replica_states(partial).values()) == ["queued", "queued"]
    assert 'id="queue-reason"' in partial.content.decode()
    listed = shown(console.get("/deployments/"))
    assert "no RTX 4090 with 1 free GPU; no listed machine has RTX 4090" in listed


@pytest.mark.django_db
def test_scale_stop_one_and_stop_through_the_page(console, funded_team):
    deployment = queued_deployment(funded_team)
    url = f"/deployments/{deployment.pk}/"
    scaled = console.post(f"{url}scale/", {"replicas": "3"}, follow=True)
    assert page_messages(scaled) == ["Scaled to 3 replicas."]
    assert list(replica_states(scaled).values()) == ["queued"] * 3

    refused = console.post(f"{url}scale/", {"replicas": "lots"}, follow=True)
    assert page_messages(refused) == ["replicas: A valid integer is required."]
    assert Deployment.objects.get().replica_count == 3

    first = deployment.replicas.order_by("pk").first()
    one = console.post(f"{url}replicas/{first.pk}/stop/", follow=True)
    assert replica_states(one)[first.pk] == "stopped"
    assert list(replica_states(one).values()).count("queued") == 3  # a replacement queued

    stopped = console.post(f"{url}stop/", follow=True)
    assert set(replica_states(stopped).values()) == {"stopped"}
    assert Deployment.objects.get().state == "stopped"
    again = console.post(f"{url}scale/", {"replicas": "1"}, follow=True)
    assert page_messages(again) == ["state: The deployment is stopped; create another."]


@pytest.mark.django_db
def test_a_viewer_sees_the_pages_but_cannot_create_or_stop(client, funded_team):
    viewer = UserFactory(username="viewer")
    add_member(funded_team, viewer, Role.VIEWER)
    deployment = queued_deployment(funded_team)
    browser = client_for(client, viewer, funded_team)
    page = shown(browser.get(f"/deployments/{deployment.pk}/"))
    assert 'id="stop-button"' not in page and "replicas/" not in page
    assert browser.post("/deployments/", FORM).status_code == 403
    assert browser.post(f"/deployments/{deployment.pk}/stop/").status_code == 403
    assert Deployment.objects.count() == 1 and Deployment.objects.get().state == "active"


@pytest.mark.django_db
def test_another_teams_deployment_is_404_and_not_listed(client, funded_team, outsider):
    deployment = queued_deployment(funded_team, name="secret-batch")
    replica = deployment.replicas.get()
    browser = client_for(client, outsider)
    url = f"/deployments/{deployment.pk}/"
    assert "secret-batch" not in shown(browser.get("/deployments/"))
    assert browser.get(url).status_code == 404
    assert browser.get(url, HTTP_HX_REQUEST="true").status_code == 404
    assert browser.post(f"{url}scale/", {"replicas": "5"}).status_code == 404
    assert browser.post(f"{url}stop/").status_code == 404
    assert browser.post(f"{url}replicas/{replica.pk}/stop/").status_code == 404
    deployment.refresh_from_db()
    replica.refresh_from_db()
    assert (deployment.state, deployment.replica_count, replica.state) == ("active", 1, "queued")


@pytest.mark.django_db
def test_disk_and_backoff_limit_from_the_form_are_stored(console):
    response = console.post(
        "/deployments/", {**FORM, "mode": "job", "disk_gb": "80", "backoff_limit": "2"}
    )
    assert response.status_code == 302
    deployment = Deployment.objects.get()
    assert (deployment.disk_gb, deployment.backoff_limit) == (80, 2)
    refused = console.post("/deployments/", {**FORM, "name": "other", "backoff_limit": "-1"})
    assert refused.status_code == 400
    said = [m for m in page_messages(refused) if m.startswith("Could not")]
    assert said[0].startswith("Could not create the deployment: backoff limit:"), said
    # Left empty, both take the API's defaults.
    console.post("/deployments/", {**FORM, "name": "plain", "disk_gb": "", "backoff_limit": ""})
    plain = Deployment.objects.get(name="plain")
    assert (plain.disk_gb, plain.backoff_limit) == (50, 6)


def listed_machine(provider, n: int, *, price: int, gpus: int, location: str = "US") -> Machine:
    """A listed, online machine as the tables know it; no host answers at its address."""
    machine = Machine.objects.create(
        team=provider, name=f"page-{n}", address=f"192.0.2.{n}", port=22, ssh_user="root",
        host_key_type="ssh-ed25519", host_key="AAAA", status="online", listed=True,
        price_per_gpu_hour=price, storage_price_per_gb_month=100_000, min_gpus=1,
        location=location, cpu_cores=16, ram_mb=65536, disk_free_gb=500, reliability=1.0,
        last_heartbeat_at=timezone.now(), verified=True,
    )  # fmt: skip
    Gpu.objects.bulk_create(
        Gpu(machine=machine, index=i, uuid=f"GPU-page-{n}-{i}", name="NVIDIA GeForce RTX 4090",
            memory_mib=24564, present=True)
        for i in range(gpus)
    )  # fmt: skip
    offer_refresh(machine_id=machine.pk)
    return machine


@pytest.mark.django_db
def test_the_match_count_follows_the_conditions_as_typed(console, provider_team):
    listed_machine(provider_team, 11, price=400_000, gpus=2)
    listed_machine(provider_team, 12, price=900_000, gpus=4, location="CA")

    def count(**conditions) -> str:
        response = console.get("/deployments/matching/", conditions)
        assert response.status_code == 200
        return response.content.decode()

    assert count() == "2 machines match now"
    assert count(gpu_names="RTX 4090", gpus_per_replica="3") == "1 machine matches now"
    assert count(gpu_names="A100") == "0 machines match now"
    assert count(max_price_per_gpu_hour="0.50") == "1 machine matches now"
    assert count(regions="CA, DE", gpus_per_replica="", max_price_per_gpu_hour="") == (
        "1 machine matches now"
    )
    assert count(min_reliability="0.5", disk_gb="50") == "2 machines match now"
    assert count(disk_gb="400") == "0 machines match now"  # 500 GB over 2 or 4 GPUs
    assert count(gpus_per_replica="0").startswith("Check the conditions: gpus per replica:")
    assert count(max_price_per_gpu_hour="cheap").startswith("Check the conditions:")
    assert not Deployment.objects.exists()


@pytest.mark.django_db
def test_the_match_count_needs_a_login(client):
    response = client.get("/deployments/matching/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.django_db
def test_replica_times_in_the_console_format(console, funded_team):
    deployment = queued_deployment(funded_team, replica_count=2)
    ended = deployment.replicas.order_by("pk").first()
    started = timezone.now() - timedelta(hours=2, minutes=5)
    Replica.objects.filter(pk=ended.pk).update(
        state="stopped", started_at=started, ended_at=started + timedelta(minutes=30)
    )
    page = shown(console.get(f"/deployments/{deployment.pk}/"))
    for moment in (started, started + timedelta(minutes=30)):
        local = timezone.localtime(moment)
        assert f">{local:%b} {local.day}, {local:%H:%M}</span>" in page
        assert f'title="{local:%Y-%m-%d %H:%M:%S}"' in page
    assert 'class="uptime"' not in page  # only running replicas have an uptime


@pytest.mark.django_db
def test_the_page_stops_polling_once_the_deployment_has_settled(console, funded_team):
    deployment = queued_deployment(funded_team)
    url = f"/deployments/{deployment.pk}/"
    assert 'hx-trigger="every 3s' in shown(console.get(url))
    console.post(f"{url}stop/")
    assert Deployment.objects.get().state == "stopped"
    page = shown(console.get(url))
    assert 'id="deployment-live"' in page and "hx-trigger" not in page
    # The poll's answer replaces its element: one without a poll ends the polling.
    partial = shown(console.get(url, HTTP_HX_REQUEST="true"))
    assert "{#" not in partial and "<html" not in partial
    assert '<div id="deployment-live">' in partial and "hx-get" not in partial


@pytest.mark.django_db
def test_a_stopped_deployment_still_polls_while_a_replica_is_live(console, funded_team):
    deployment = queued_deployment(funded_team)
    Deployment.objects.filter(pk=deployment.pk).update(state="stopped")
    partial = shown(console.get(f"/deployments/{deployment.pk}/", HTTP_HX_REQUEST="true"))
    assert 'hx-swap="outerHTML"' in partial and 'hx-trigger="every 3s' in partial
