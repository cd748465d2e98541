"""A provider sets a machine's listing terms in Chromium: the region is a country chosen from a
list, and a refused term keeps everything typed, saying which field and why (the page lost
every value before, and took "Mars Base Alpha" as a region)."""

from __future__ import annotations

import pytest

from hosts.models import Gpu, Machine
from marketplace.models import Role
from tests.browser.test_rent_flow import log_in
from tests.factories import TeamFactory, UserFactory, add_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_terms_keep_what_was_typed_when_one_is_refused_and_the_region_is_a_country(
    page, live_server_url
):
    from playwright.sync_api import expect

    team = TeamFactory(name="GPU Provider Inc")
    provider = UserFactory(username="provider")
    add_member(team, provider, Role.OWNER)
    machine = Machine.objects.create(
        team=team, name="rack-1", address="10.7.0.1", status="online", cpu_cores=8,
        ram_mb=32768, disk_free_gb=500, location="US",
    )  # fmt: skip
    Gpu.objects.create(
        machine=machine, index=0, uuid="GPU-00000000-0000-0000-0000-000000000001",
        name="NVIDIA GeForce RTX 4090", memory_mib=24564,
    )  # fmt: skip
    log_in(page, live_server_url, provider, team)
    page.goto(f"{live_server_url}/machines/{machine.pk}/")

    form = page.locator("#terms-form")
    region = form.locator("select[name=location]")
    expect(region).to_have_value("US")
    region.select_option(label="Germany (DE)")
    form.locator("input[name=price]").fill("0.85")
    form.locator("input[name=min_bid]").fill("0.40")
    form.locator("input[name=end_date]").fill("2031-05-04")
    form.locator("input[name=storage_price]").fill("-2")  # refused
    form.get_by_role("button", name="Save terms").click()

    expect(page.locator("#storage_price-error")).to_contain_text("must not be negative")
    expect(page.locator(".message.error")).to_contain_text("storage price")
    expect(region).to_have_value("DE")
    expect(form.locator("input[name=price]")).to_have_value("0.85")
    expect(form.locator("input[name=min_bid]")).to_have_value("0.40")
    expect(form.locator("input[name=end_date]")).to_have_value("2031-05-04")
    expect(form.locator("input[name=storage_price]")).to_have_value("-2")
    machine.refresh_from_db()
    assert (machine.location, machine.price_per_gpu_hour) == ("US", 0)

    form.locator("input[name=storage_price]").fill("0.1")
    form.get_by_role("button", name="Save terms").click()
    expect(page.locator(".message.success")).to_contain_text("Terms saved")
    expect(region).to_have_value("DE")
    machine.refresh_from_db()
    assert (machine.location, machine.price_per_gpu_hour) == ("DE", 850_000)
    page.goto(f"{live_server_url}/machines/")
    expect(page.get_by_text("· Germany")).to_be_visible()
