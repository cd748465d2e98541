"""A provider types a bad machine address in Chromium: the page says what is wrong with it,
keeps what was typed, and saves nothing (it became a machine in error before)."""

from __future__ import annotations

import pytest

from hosts.models import Machine
from marketplace.models import Role
from tests.browser.test_rent_flow import log_in
from tests.factories import TeamFactory, UserFactory, add_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize(
    ("typed", "reason"),
    [
        ("999.999.1.1", "is not an IP address"),
        ("http://example.com:22", "without a scheme"),
    ],
)
def test_a_bad_machine_address_is_refused_before_anything_is_saved(
    page, live_server_url, typed, reason
):
    from playwright.sync_api import expect

    team = TeamFactory(name="GPU Provider Inc")
    provider = UserFactory(username="provider")
    add_member(team, provider, Role.OWNER)
    log_in(page, live_server_url, provider, team)

    page.goto(f"{live_server_url}/machines/add/")
    page.fill("input[name=name]", "rack-1")
    page.fill("input[name=address]", typed)
    page.get_by_role("button", name="Connect").click()
    expect(page.locator(".message.error")).to_contain_text(reason)
    expect(page.locator("input[name=address]")).to_have_value(typed)
    expect(page.locator("input[name=name]")).to_have_value("rack-1")
    assert not Machine.objects.exists()
