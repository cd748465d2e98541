"""An interruptible rental in Chromium: bid in the rent dialog, see it interrupted live when an
on-demand renter takes the GPU, raise the bid, and see it run again when the GPU is free.

uvicorn and a Celery worker run as real processes: the interruption, the stop and the start
again happen in the worker, and the page learns of each only through the WebSocket.
"""

from __future__ import annotations

import re
import threading

import pytest

from marketplace.models import Rental, Role
from tests.browser.test_rent_flow import log_in
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund, machine_for

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]


def elsewhere(call):
    """Run ``call`` in its own thread: Playwright's event loop runs in the test's thread, where
    Django's event publishing (async_to_sync) cannot run."""
    from django.db import connection

    result = []

    def run():
        try:
            result.append(call())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    return result[0]


def test_a_bid_is_interrupted_and_wins_its_gpu_back_live(
    page, live_server_url, celery_worker, team, owner, sim_host_factory, provider_team
):
    from playwright.sync_api import expect

    machine = machine_for(
        sim_host_factory(gpus=1), provider_team, min_bid_price_per_gpu_hour=200_000
    )
    fund(team)
    log_in(page, live_server_url, owner, team)

    page.goto(f"{live_server_url}/offers/?q=machine_id%3D{machine.pk}")
    row = page.locator(f"tr[data-machine='{machine.pk}']")
    expect(row.locator(".bid-from")).to_contain_text("$0.20")
    row.locator(".rent-button").click()
    dialog = page.locator("#rent-dialog")
    dialog.locator("input[name=rent_kind][value=bid]").check()
    expect(dialog.locator("#bid-fields")).to_be_visible()
    dialog.locator("input[name=bid_price]").fill("0.15")
    expect(page.locator("#rent-price")).to_contain_text("Bid at least $0.20")
    expect(page.locator("#rent-confirm")).to_be_disabled()
    dialog.locator("input[name=bid_price]").fill("0.30")
    expect(page.locator("#rent-price")).to_contain_text("$0.30/hour")
    dialog.locator("input[name=entrypoint]").fill("sh")
    dialog.locator("input[name=args]").fill("-c 'exec sleep 600'")
    dialog.locator("#rent-confirm").click()
    expect(page).to_have_url(re.compile(r"/instances/\d+/$"))
    instance_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    badge = page.locator("#state-badge")
    expect(badge).to_have_attribute("data-state", "running", timeout=90_000)
    expect(page.locator("#bid-note")).to_contain_text("Interruptible")
    assert Rental.objects.get(instance_id=instance_id).price_per_gpu_hour == 300_000

    # Another team rents the GPU on demand: the page shows the interruption by itself.
    rival = TeamFactory(name="On-demand Co")
    add_member(rival, UserFactory(username="ondemand"), Role.OWNER)
    fund(rival)
    rival_api = key_client(rival)
    taken = elsewhere(
        lambda: rival_api.post(
            "/api/v1/instances/",
            {"machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
             "duration_hours": 1, "entrypoint": "sh", "args": ["-c", "exec sleep 600"]},
            format="json",
        )
    )  # fmt: skip
    assert taken.status_code == 201, taken.content
    expect(badge).to_have_attribute("data-state", "stopped", timeout=90_000)
    expect(page.locator("#bid-note")).to_contain_text("Interrupted")

    page.fill("#bid-form input[name=bid_price]", "0.45")
    page.click("#bid-form button[type=submit]")
    expect(page.locator(".message")).to_contain_text("Bid changed to $0.45")
    expect(page.locator(".message")).to_contain_text("waiting to win its GPUs back")

    # The on-demand rental ends: the bid wins the GPU back and runs again, live.
    gone = elsewhere(lambda: rival_api.delete(f"/api/v1/instances/{taken.json()['id']}/"))
    assert gone.status_code == 202
    expect(badge).to_have_attribute("data-state", "running", timeout=90_000)
    expect(page.locator("#bid-note")).not_to_contain_text("Interrupted")
