"""A provider asks for a payout in the console, in Chromium: from the Earnings page to the
Payouts page, a refused amount says why, an accepted one shows in the history as waiting,
and the operator's decision shows there next; the page follows every step live, and a
waiting request is cancelled from it, after a question."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from billing import payouts
from billing.models import PayoutRequest, PayoutStatus
from tests.browser.test_rent_flow import log_in
from tests.conftest import key_client
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


def test_the_payouts_page_follows_asks_decisions_and_cancels_without_a_reload(
    page, live_server_url, team, owner
):
    """Asked elsewhere (the API, another tab), decided by the operator, cancelled through the
    API: the open page shows each step by itself. What the provider is typing stays."""
    earn(team, 36, "live")
    log_in(page, live_server_url, owner, team)
    page.goto(f"{live_server_url}/payouts/")
    expect(page.locator("#live-dot")).to_have_class(re.compile("on"))
    page.evaluate("window.__stayed = true")
    unpaid, pending = page.locator("#payout-unpaid"), page.locator("#payout-pending")
    rows = page.locator("#payout-history tbody tr")

    page.locator("#payout-form input[name=amount]").fill("15")
    earn(team, 5, "live-more")  # more earnings arrive while the provider types
    expect(unpaid).to_have_text("$41.00", timeout=15_000)
    expect(page.locator("#payout-form input[name=amount]")).to_have_value("15")  # kept

    asked, _ = payouts.payout_request_create(team_id=team.pk, amount=12_340_000)
    expect(rows).to_have_count(1, timeout=15_000)
    expect(rows.first).to_contain_text("waiting for approval")
    expect(pending).to_have_text("$12.34")
    expect(unpaid).to_have_text("$28.66")
    expect(page.locator("#payout-ask")).to_contain_text("is waiting for the operator")

    payouts.payout_approve(payout_id=asked.pk, note="SEPA 0042", decided_by_id=None)
    expect(rows.first).to_contain_text("paid", timeout=15_000)
    expect(rows.first).to_contain_text("SEPA 0042")
    expect(pending).to_have_text("$0.00")
    expect(page.locator("#payout-form")).to_be_visible()

    second, _ = payouts.payout_request_create(team_id=team.pk, amount=10_000_000)
    expect(rows).to_have_count(2, timeout=15_000)
    payouts.payout_reject(payout_id=second.pk, reason="Bank details missing", decided_by_id=None)
    expect(rows.first).to_contain_text("Bank details missing", timeout=15_000)
    expect(rows.first).to_contain_text("rejected")
    expect(unpaid).to_have_text("$28.66")

    third = key_client(team).post("/api/v1/payouts/", {"amount": "20"}, format="json").json()
    expect(rows).to_have_count(3, timeout=15_000)
    expect(pending).to_have_text("$20.00")
    assert key_client(team).post(f"/api/v1/payouts/{third['id']}/cancel/").status_code == 200
    expect(rows.first).to_contain_text("cancelled", timeout=15_000)
    expect(pending).to_have_text("$0.00")
    expect(unpaid).to_have_text("$28.66")
    assert page.evaluate("window.__stayed") is True  # the same document: no reload


def test_cancelling_a_payout_request_asks_first(page, live_server_url, team, owner):
    earn(team, 36, "cancel")
    asked, _ = payouts.payout_request_create(team_id=team.pk, amount=30_000_000)
    log_in(page, live_server_url, owner, team)
    page.goto(f"{live_server_url}/payouts/")
    expect(page.locator("#payout-unpaid")).to_have_text("$6.00")
    questions: list[str] = []

    def answer(dialog, accept: bool) -> None:
        questions.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda dialog: answer(dialog, False))
    page.get_by_role("button", name="Cancel request").click()
    assert questions and "$30.00" in questions[0] and "back to your unpaid earnings" in questions[0]
    asked.refresh_from_db()
    assert asked.status == PayoutStatus.REQUESTED  # dismissed: still waiting

    page.once("dialog", lambda dialog: answer(dialog, True))
    page.get_by_role("button", name="Cancel request").click()
    row = page.locator(f'#payout-history tr[data-payout="{asked.pk}"]')
    expect(row).to_contain_text("cancelled")
    expect(row).to_contain_text(f"Cancelled by {owner.username}")
    expect(page.locator("#payout-unpaid")).to_have_text("$36.00")
    expect(page.locator("#payout-form")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel request")).to_have_count(0)
    asked.refresh_from_db()
    assert asked.status == PayoutStatus.CANCELLED and asked.decided_by_id == owner.pk
