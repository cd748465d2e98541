"""A renter in Chromium: log in, search, rent, watch it turn running live, read logs, stop.

The web server (uvicorn) and a Celery worker run as real processes, so the launch happens
in the worker and the page learns of it only through the WebSocket.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import PASSWORD
from tests.marketplace.conftest import fund, machine_for

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_renter_rents_and_watches_status_live(
    page, live_server_url, celery_worker, team, owner, sim_host_factory, provider_team
):
    from playwright.sync_api import expect

    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    fund(team)

    page.goto(f"{live_server_url}/accounts/login/")
    page.fill("input[name=username]", owner.username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_contain_text("owner's team")  # the personal team first
    page.select_option("#team-select", str(team.pk))  # the header switcher submits on change
    expect(page.locator("h1")).to_contain_text("Acme GPUs")

    page.goto(f"{live_server_url}/offers/")
    page.fill("input[name=q]", "gpu_name=RTX_4090 num_gpus>=2 -o dph_total")
    page.click("#offer-search button[type=submit]")
    row = page.locator(f"tr[data-machine='{machine.pk}']")
    expect(row).to_contain_text("RTX 4090")

    row.locator(".rent-button").click()
    dialog = page.locator("#rent-dialog")
    expect(dialog).to_be_visible()
    dialog.locator("input[name=num_gpus]").fill("2")
    dialog.locator("input[name=duration_hours]").fill("2")
    expect(page.locator("#rent-price")).to_contain_text("$1.00/hour")
    dialog.locator("input[name=entrypoint]").fill("sh")
    page.evaluate(
        "document.querySelector('#rent-form input[name=args]').value = '-c env;sleep${IFS}600'"
    )
    dialog.locator("textarea[name=env]").fill("MARKER=hello-from-the-browser")
    dialog.locator("#rent-confirm").click()

    expect(page).to_have_url(re.compile(r"/instances/\d+/$"))
    expect(page.locator("#live-dot")).to_have_class(re.compile("on"))
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    badge = page.locator("#state-badge")
    expect(badge).to_have_attribute("data-state", "running", timeout=60_000)
    assert page.evaluate("window.__sameDocument") is True

    page.click("text=Refresh")
    expect(page.locator("#log-text")).to_contain_text("MARKER=hello-from-the-browser")

    page.click("#stop-button")
    expect(page.locator("#state-badge")).to_have_attribute("data-state", "stopped", timeout=60_000)
