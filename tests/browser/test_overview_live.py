"""The Overview in Chromium: a change of credit (a grant, as a top-up would be) shows on an open
Overview by itself, through the team's live feed, without a reload."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from billing.credits import credit_grant
from billing.selectors import team_balance
from marketplace.templatetags.console import usd
from tests.browser.test_rent_flow import log_in

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
