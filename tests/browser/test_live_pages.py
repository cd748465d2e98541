"""Pages that show numbers events change update by themselves, in Chromium, through the team's
live feed and without a reload: the Overview and the billing page when credit moves (a grant,
as a top-up would be), the provider's machines page when a renter takes a GPU and gives it back."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from billing.credits import credit_grant
from billing.selectors import team_balance
from billing.templatetags.billing_money import usd
from marketplace.models import Membership
from tests.browser.test_rent_flow import log_in
from tests.conftest import key_client
from tests.marketplace.conftest import fund, machine_for
from tests.marketplace.test_rental_lifecycle import rented

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_the_overview_shows_new_credit_without_a_reload(page, live_server_url, team, owner):
    log_in(page, live_server_url, owner, team)
    page.goto(f"{live_server_url}/")
    available = page.locator("#overview-available")
    expect(available).to_have_text(usd(0))
    expect(page.locator("#live-dot")).to_have_class(re.compile("on"))
    page.evaluate("window.__stayed = true")

    credit_grant(team_id=team.pk, amount=25_000_000, reason="welcome", idempotency_key="ov-1")

    expect(available).to_have_text(usd(team_balance(team.pk).available), timeout=15_000)
    assert usd(team_balance(team.pk).available) == usd(25_000_000)
    assert page.evaluate("window.__stayed") is True  # the same document: no reload


def test_the_billing_page_shows_new_credit_and_its_ledger_row_without_a_reload(
    page, live_server_url, team, owner
):
    log_in(page, live_server_url, owner, team)
    page.goto(f"{live_server_url}/billing/")
    expect(page.locator("#live-dot")).to_have_class(re.compile("on"))
    page.evaluate("window.__stayed = true")

    credit_grant(team_id=team.pk, amount=12_000_000, reason="bonus", idempotency_key="bill-1")

    expect(page.locator("#balance-available")).to_have_text(usd(12_000_000), timeout=15_000)
    expect(page.locator("#balance-total")).to_have_text(usd(12_000_000))
    expect(page.locator("#ledger")).to_contain_text("bonus")
    assert page.evaluate("window.__stayed") is True


def test_the_providers_machines_page_counts_a_rented_gpu_and_its_return_without_a_reload(
    page, live_server_url, team, owner, sim_host_factory, provider_team
):
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    provider = Membership.objects.get(team=provider_team).user
    log_in(page, live_server_url, provider, provider_team)
    page.goto(f"{live_server_url}/machines/")
    counts = page.locator("#fleet-gpus")
    expect(counts).to_contain_text("0 rented · 2 free")
    expect(page.locator("#live-dot")).to_have_class(re.compile("on"))
    page.evaluate("window.__stayed = true")

    fund(team)
    renter = key_client(team)
    instance = rented(renter, machine)
    expect(counts).to_contain_text("1 rented · 1 free", timeout=15_000)

    assert renter.delete(f"/api/v1/instances/{instance.pk}/").status_code in (200, 202, 204)
    expect(counts).to_contain_text("0 rented · 2 free", timeout=30_000)
    assert page.evaluate("window.__stayed") is True
