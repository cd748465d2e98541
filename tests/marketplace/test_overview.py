"""The Overview (console home): where a renter and a provider stand, from a real rental on a
simulated host and real charges on the ledger."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from billing.holds import hold_capture_usage
from billing.models import Entry
from billing.selectors import invoice_for_month, team_balance
from billing.templatetags.billing_money import rate, usd
from marketplace.models import Membership
from marketplace.services.pricing import SECONDS_PER_MONTH
from tests.conftest import client_for, key_client
from tests.marketplace.conftest import machine_for
from tests.marketplace.test_rental_lifecycle import rented

pytestmark = pytest.mark.django_db(transaction=True)


def text(html: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', html)
    assert found, f"no #{element_id} on the page"
    return found.group(1).strip()


def test_an_empty_team_is_told_what_to_do_first(client, owner, team):
    html = client_for(client, owner, team).get("/").content.decode()
    assert text(html, "overview-running") == "0 instances"
    assert "Nothing runs for this team yet" in html and 'href="/offers/"' in html
    assert "Connect a machine over SSH" in html  # not a provider yet
    assert 'id="no-spend"' in html and 'id="overview-hosting"' not in html


def test_the_overview_shows_credit_what_runs_its_hourly_cost_spend_and_the_hosts_side(
    client, owner, funded_team, sim_host_factory, provider_team
):
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    instance = rented(key_client(funded_team), machine)
    rental = instance.rental
    hold_capture_usage(hold_id=rental.hold_id, kind="gpu", owed_total=400_000)

    page = client_for(client, owner, funded_team).get("/")
    assert page.status_code == 200
    html = page.content.decode()
    balance = team_balance(funded_team.pk)
    assert text(html, "overview-available") == usd(balance.available)
    assert f"{usd(balance.held)} held" in html
    assert text(html, "overview-running") == "1 instance"
    storage_hour = (rental.storage_price_per_gb_month * rental.disk_gb * 3600 * 2 + SECONDS_PER_MONTH) // (2 * SECONDS_PER_MONTH)  # fmt: skip
    hourly = rental.price_per_gpu_hour * rental.gpu_count + storage_hour
    assert text(html, "overview-per-hour") == rate(hourly)
    # What the month's invoice adds up to, and today's bar in the spend chart.
    month = invoice_for_month(Entry.objects.filter(team=funded_team), timezone.localdate())
    assert month.total >= 400_000
    assert text(html, "overview-spent") == usd(month.total)
    assert "<svg" in html and f"{usd(month.total)} charged" in html
    assert 'id="overview-hosting"' not in html  # the renter lists no machines

    provider = Membership.objects.get(team=provider_team).user
    hosting = client_for(client, provider, provider_team).get("/").content.decode()
    assert text(hosting, "overview-gpus-rented") == "1 of 2"
    assert "Online</div>" in hosting and "1 machine<" in hosting
    earned = text(hosting, "overview-earned")
    assert earned != usd(0) and earned != usd(month.total)  # net of the platform fee


def test_the_live_refresh_returns_only_the_overview_of_the_active_team(
    client, owner, funded_team, outsider
):
    answer = client_for(client, owner, funded_team).get("/", HTTP_HX_REQUEST="true")
    html = answer.content.decode()
    assert "<html" not in html and 'id="overview-available"' in html
    assert text(html, "overview-available") == usd(team_balance(funded_team.pk).available)
    client.logout()
    theirs = client_for(client, outsider).get("/", HTTP_HX_REQUEST="true").content.decode()
    assert text(theirs, "overview-available") == usd(0)
