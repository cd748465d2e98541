"""A provider asks for a payout in the console, in Chromium: from the Earnings page to the
Payouts page, a refused amount says why, an accepted one shows in the history as waiting,
and the operator's decision shows there next."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from billing import payouts
from billing.models import PayoutRequest
from tests.browser.test_rent_flow import log_in
from tests.marketplace.test_payouts import earn

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_provider_requests_a_payout_and_sees_it_in_the_history(page, live_server_url, team, owner):
    earn(team, 36, "browser")  # $36.00 of unpaid earnings; the minimum is $10.00
    log_in(page, live_server_url, owner, team)
    page.goto(f"{live_server_url}/earnings/")
    page.get_by_role("link", name="Request a payout").click()
    expect(page.locator("h1")).to_have_text("Payouts")
    expect(page.locator("#payout-unpaid")).to_have_text("$36.00")
    amount = page.locator("#payout-form input[name=amount]")
    expect(amount).to_have_value("36.00")  # the whole unpaid balance, ready to ask

    amount.fill("50")
    page.get_by_role("button", name="Request payout").click()
    expect(page.locator("#payout-errors")).to_contain_text(
        "Amount: More than your unpaid earnings ($36.00)."
    )
    expect(page.locator("#payout-form input[name=amount]")).to_have_value("50")  # kept
    assert not PayoutRequest.objects.exists()

    page.locator("#payout-form input[name=amount]").fill("12.34")
    page.get_by_role("button", name="Request payout").click()
    row = page.locator("#payout-history tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("$12.34")
    expect(row).to_contain_text("waiting for approval")
    expect(page.locator("#payout-unpaid")).to_have_text("$23.66")
    expect(page.locator("#payout-pending")).to_have_text("$12.34")
    expect(page.locator("#payout-ask")).to_contain_text("is waiting for the operator")

    payout = PayoutRequest.objects.get(team=team)
    payouts.payout_approve(payout_id=payout.pk, note="SEPA 0042", decided_by_id=None)
    page.reload()
    expect(row).to_contain_text("paid")
    expect(row).to_contain_text("SEPA 0042")
    expect(page.locator("#payout-pending")).to_have_text("$0.00")
    expect(page.locator("#payout-form")).to_be_visible()  # the next one may be asked
