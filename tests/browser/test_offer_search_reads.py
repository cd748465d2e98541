"""A renter searches offers in Chromium: "A100" (typed, or chosen from the GPU list) finds the
A100 models and not the A10; regions read as countries; prices per hour keep their exact
digits while the credit reads to the cent."""

from __future__ import annotations

import pytest

from billing.credits import credit_grant
from hosts.models import Gpu, Machine
from marketplace.models import Role
from marketplace.services.offers import offer_refresh
from tests.browser.test_rent_flow import log_in
from tests.factories import TeamFactory, UserFactory, add_member

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def offered(provider, name: str, gpu: str, location: str, price: int) -> Machine:
    machine = Machine.objects.create(
        team=provider, name=name, address=f"10.8.{Machine.objects.count()}.1", status="online",
        listed=True, price_per_gpu_hour=price, storage_price_per_gb_month=100_000,
        location=location, cpu_cores=8, ram_mb=32768, disk_free_gb=500, reliability=0.99,
        driver_version="550.54.14", cuda_version="12.4",
    )  # fmt: skip
    Gpu.objects.create(
        machine=machine, index=0, uuid=f"GPU-{machine.pk:08d}-0000-0000-0000-000000000000",
        name=gpu, memory_mib=24564,
    )  # fmt: skip
    offer_refresh(machine_id=machine.pk)
    return machine


def test_a_gpu_family_search_with_countries_and_honest_prices(page, live_server_url):
    from playwright.sync_api import expect

    provider = TeamFactory(name="Host Co")
    sxm = offered(provider, "sxm", "NVIDIA A100-SXM4-80GB", "DE", 1_234_567)
    pcie = offered(provider, "pcie", "NVIDIA A100-PCIE-40GB", "US", 900_000)
    a10 = offered(provider, "a10", "NVIDIA A10", "JP", 400_000)
    team = TeamFactory(name="Renters")
    renter = UserFactory(username="renter")
    add_member(team, renter, Role.OWNER)
    credit_grant(team_id=team.id, amount=99_532_082, reason="Welcome", idempotency_key="w")
    log_in(page, live_server_url, renter, team)
    expect(page.locator("#overview-available")).to_have_text("$99.53")

    page.goto(f"{live_server_url}/offers/")
    page.fill("input[name=q]", "gpu_name=A100")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("#offers-table tbody tr")
    expect(rows).to_have_count(2)
    assert sorted(rows.evaluate_all("rs => rs.map(r => +r.dataset.machine)")) == sorted(
        [sxm.pk, pcie.pk]
    )
    row = page.locator(f'#offers-table tr[data-machine="{sxm.pk}"]')
    expect(row).to_contain_text("Germany")
    expect(row.locator(".offer-price")).to_have_text("$1.234567")
    expect(page.locator(f'#offers-table tr[data-machine="{pcie.pk}"]')).to_contain_text(
        "United States"
    )

    page.fill("input[name=q]", "")
    page.select_option("select[name=gpu_name]", "A100")
    page.select_option("select[name=geolocation]", label="Germany")
    page.get_by_role("button", name="Search").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-machine", str(sxm.pk))

    page.goto(f"{live_server_url}/offers/?q=gpu_name%3DA10")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-machine", str(a10.pk))
    expect(rows.first).to_contain_text("Japan")
