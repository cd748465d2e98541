"""/metrics: refused to the public, served to the scraper's token and to staff; requests
counted by route name and status; domain gauges that match the rows; task metrics."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db.models import F

from billing.credits import credit_grant
from billing.holds import hold_create
from billing.models import Account, AccountKind
from hosts.models import Gpu, Machine
from marketplace.celery import app as celery_app
from marketplace.deployments.tasks import deployment_reconcile
from marketplace.models.deployments import Deployment, Replica
from marketplace.observability.ledger_check import CACHE_KEY
from marketplace.tasks import invitations_expire
from scheduler.models import GpuAllocation, Instance
from tests.conftest import client_for, key_client
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_metrics_is_404_to_anyone_without_the_token_or_staff(client, metrics_token, owner, team):
    assert client.get("/metrics").status_code == 404
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token")
    assert wrong.status_code == 404
    assert b"gpumkt_" not in wrong.content
    client_for(client, owner, team)  # signed in, but not staff
    assert client.get("/metrics").status_code == 404


def test_metrics_with_no_token_configured_refuses_an_empty_bearer(client, settings):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer").status_code == 404


def test_a_staff_session_may_read_metrics(client):
    client.force_login(UserFactory(username="operator", is_staff=True))
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"gpumkt_machines" in response.content


def test_requests_are_counted_by_route_name_and_status_never_by_path(funded_team, scrape):
    api = key_client(funded_team)
    series = {"view": "api-instance-detail", "method": "GET", "status": "404"}
    before = scrape().value("django_http_responses_total_by_status_view_method_total", **series)
    assert api.get("/api/v1/instances/987654/").status_code == 404
    assert api.get("/api/v1/instances/987655/").status_code == 404
    scraped = scrape()
    after = scraped.value("django_http_responses_total_by_status_view_method_total", **series)
    assert after == (before or 0) + 2
    latency = scraped.value(
        "django_http_requests_latency_seconds_by_view_method_count",
        view="api-instance-detail",
        method="GET",
    )
    assert latency is not None and latency >= 2
    # No series per id: the raw path appears in no label (only labels: a latency's digits
    # may well contain 987654).
    label_values = {value for sample in scraped.samples for value in sample.labels.values()}
    assert not [v for v in label_values if "987654" in v or "/api/v1/instances/" in v]
    assert "api-instance-detail" in label_values


def test_domain_gauges_match_the_rows(provider_team, funded_team, scrape):
    online = Machine.objects.create(
        team=provider_team, name="a", address="10.9.0.1", status="online"
    )
    Machine.objects.create(team=provider_team, name="b", address="10.9.0.2", status="offline")
    gpus = Gpu.objects.bulk_create(
        [Gpu(machine=online, index=i, uuid=f"GPU-{i}", name="RTX", memory_mib=1) for i in range(3)]
    )
    running = Instance.objects.create(
        team=funded_team, machine=online, gpu_count=1, image="busybox", state="running"
    )
    Instance.objects.create(
        team=funded_team, machine=online, gpu_count=1, image="busybox", state="failed"
    )
    GpuAllocation.objects.create(instance=running, gpu=gpus[0])
    deployment = Deployment.objects.create(team=funded_team, name="d", image="busybox")
    Replica.objects.bulk_create([Replica(deployment=deployment) for _ in range(2)])
    hold_create(
        team_id=funded_team.pk,
        provider_team_id=provider_team.pk,
        amount=2_500_000,
        reference=f"rental:{running.pk}",
        idempotency_key="test-observability-hold",
    )

    scraped = scrape()
    assert scraped.value("gpumkt_machines", status="online") == 1
    assert scraped.value("gpumkt_machines", status="offline") == 1
    assert scraped.value("gpumkt_machines", status="error") == 0
    assert scraped.value("gpumkt_gpus", state="rented") == 1
    assert scraped.value("gpumkt_gpus", state="free") == 2
    assert scraped.value("gpumkt_instances", state="running") == 1
    assert scraped.value("gpumkt_instances", state="failed") == 1
    assert scraped.value("gpumkt_instances", state="launching") == 0
    assert scraped.value("gpumkt_deployment_replicas_queued") == 2
    assert scraped.value("gpumkt_held_credit_dollars") == 2.5
    assert scraped.value("gpumkt_ledger_consistent") == 1
    for source in ("machines", "gpus", "instances", "replicas", "held_credit", "ledger", "queues"):
        assert scraped.value("gpumkt_scrape_source_up", source=source) == 1, source


def test_the_ledger_gauge_turns_0_when_a_held_balance_disagrees_with_the_holds(funded_team, scrape):
    credit_grant(
        team_id=funded_team.pk, amount=1_000_000, reason="test", idempotency_key="obs-ledger"
    )
    assert scrape().value("gpumkt_ledger_consistent") == 1
    # A bug that moved money outside a transfer: the balances no longer sum to zero.
    Account.objects.filter(team=funded_team, kind=AccountKind.AVAILABLE).update(
        balance=F("balance") - 1
    )
    assert scrape().value("gpumkt_ledger_consistent") == 1  # cached for the period
    cache.delete(CACHE_KEY)
    assert scrape().value("gpumkt_ledger_consistent") == 0


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_queue_length_counts_the_tasks_waiting_in_the_broker(scrape):
    celery_app.control.purge()
    try:
        celery_app.send_task("marketplace.tasks.offers_refresh")
        celery_app.send_task("marketplace.tasks.offers_refresh")
        assert scrape().value("gpumkt_celery_queue_length", queue="celery") == 2
    finally:
        celery_app.control.purge()
    assert scrape().value("gpumkt_celery_queue_length", queue="celery") == 0


def test_a_task_run_is_counted_by_name_and_outcome_with_its_duration(scrape):
    task = {"task": "marketplace.tasks.invitations_expire", "outcome": "succeeded"}
    before = scrape()
    count = before.value("gpumkt_celery_tasks_total", **task) or 0
    timed = before.value("gpumkt_celery_task_duration_seconds_count", **task) or 0
    invitations_expire.apply()  # runs here, through Celery's tracer: its signals fire
    after = scrape()
    assert after.value("gpumkt_celery_tasks_total", **task) == count + 1
    assert after.value("gpumkt_celery_task_duration_seconds_count", **task) == timed + 1


def test_a_failing_task_is_counted_as_failed(scrape):
    task = {"task": "marketplace.tasks.deployment_reconcile", "outcome": "failed"}
    count = scrape().value("gpumkt_celery_tasks_total", **task) or 0
    result = deployment_reconcile.apply(args=("not-a-deployment-id",), throw=False)
    assert result.failed()
    assert scrape().value("gpumkt_celery_tasks_total", **task) == count + 1
