"""Actions that cannot be undone ask first, in Chromium: dismissing the question changes nothing."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from marketplace.models import ApiKey, Membership
from marketplace.services.accounts import api_key_create
from tests.browser.test_rent_flow import log_in

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_revoking_an_api_key_asks_first(page, live_server_url, team, owner):
    membership = Membership.objects.get(team=team, user=owner)
    issued = api_key_create(membership=membership, name="ci-runner")
    key = ApiKey.objects.get(name="ci-runner", team=team)
    log_in(page, live_server_url, owner, team)
    page.goto(f"{live_server_url}/team/api-keys/")
    asked: list[str] = []

    def answer(dialog, accept: bool) -> None:
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda dialog: answer(dialog, False))
    page.get_by_role("button", name="Revoke").click()
    assert asked and "ci-runner" in asked[0] and "stop working" in asked[0]
    key.refresh_from_db()
    assert key.revoked_at is None and issued  # dismissed: still active

    page.once("dialog", lambda dialog: answer(dialog, True))
    page.get_by_role("button", name="Revoke").click()
    expect(page.locator("td .badge", has_text="revoked")).to_be_visible()
    key.refresh_from_db()
    assert key.revoked_at is not None
