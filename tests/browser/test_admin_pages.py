"""The operator's Django admin lists instances, rentals and deployments (read only: their
changes go through the services), and the admin's pages ask for no missing favicon."""

from __future__ import annotations

import pytest

from marketplace.models import Deployment
from tests.conftest import PASSWORD
from tests.factories import TeamFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_admin_lists_instances_rentals_and_deployments(page, live_server_url):
    from playwright.sync_api import expect

    operator = UserFactory(username="operator", is_staff=True, is_superuser=True)
    deployment = Deployment.objects.create(
        team=TeamFactory(name="Acme GPUs"), name="inference-fleet", image="gpumkt/busybox:latest"
    )
    refused = []
    page.on("response", lambda r: r.status >= 400 and refused.append(f"{r.status} {r.url}"))

    page.goto(f"{live_server_url}/admin/login/")
    page.fill("input[name=username]", operator.username)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    for name in ("Instances", "Rentals", "Deployments"):
        expect(page.locator("#content-main").get_by_role("link", name=name)).to_be_visible()
    page.goto(f"{live_server_url}/admin/scheduler/instance/")
    expect(page.locator("#content h1")).to_contain_text("instance")
    page.goto(f"{live_server_url}/admin/marketplace/rental/")
    expect(page.locator("#content h1")).to_contain_text("rental")
    page.goto(f"{live_server_url}/admin/marketplace/deployment/")
    expect(page.locator("#result_list")).to_contain_text("inference-fleet")
    page.goto(f"{live_server_url}/admin/marketplace/deployment/{deployment.pk}/change/")
    expect(page.locator("#content")).to_contain_text("gpumkt/busybox:latest")
    expect(page.locator("input[name=_save]")).to_have_count(0)  # read only
    assert refused == []
