"""A renter in Chromium creates a deployment in the console and watches its replicas come up
without a reload (issue 12).

The web server (uvicorn) and a Celery worker run as real processes, and the replica's rental
is launched by the worker on a simulated host (its sshd down at first, so the page shows the
replica placed before running); the detail page learns of it only through its
htmx poll (every 3 s) and the instance state events. A marker set on the window after the page
loads must still be there when the replica shows "running": the same document, not a reload.
The screenshot is kept under VAR_DIR for a person to look at.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from marketplace.models import Deployment
from tests.browser.test_rent_flow import log_in
from tests.marketplace.conftest import fund, machine_for

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(os.environ["VAR_DIR"])  # made by the live server fixture

# Stays up, and exits at once on `docker stop` (a bare `sleep` as PID 1 ignores SIGTERM).
ARGS = "-c 'trap \"exit 0\" TERM; while :; do sleep 1; done'"


def running_rows(page):
    return page.locator("#replicas-table tr[data-replica]:has(.badge[data-state=running])")


def test_create_a_deployment_and_watch_its_replicas_come_up_without_a_reload(
    page, live_server_url, celery_worker, team, owner, sim_host_factory, provider_team
):
    from playwright.sync_api import expect

    host = sim_host_factory(gpus=2)
    machine = machine_for(host, provider_team)
    fund(team)
    log_in(page, live_server_url, owner, team)

    page.goto(f"{live_server_url}/deployments/")
    expect(page.locator("#deployments-table")).to_contain_text("No deployments yet")
    form = page.locator("#create-deployment form")
    form.locator("input[name=name]").fill("web")
    form.locator("input[name=image]").fill("gpumkt/busybox:latest")
    form.locator("input[name=entrypoint]").fill("sh")
    form.locator("input[name=args]").fill(ARGS)
    form.locator("input[name=gpu_names]").fill("RTX 4090")
    # The conditions are counted against the market as they are typed.
    expect(page.locator("#matching-count")).to_have_text("1 machine matches now")
    form.locator("input[name=gpu_names]").fill("A100")
    expect(page.locator("#matching-count")).to_have_text("0 machines match now")
    form.locator("input[name=gpu_names]").fill("RTX 4090")
    expect(page.locator("#matching-count")).to_have_text("1 machine matches now")
    form.locator("select[name=policy]").select_option("binpack")
    # The machine's sshd is down while creating, so the page first shows the replica placed
    # but not yet running; the worker's retry launches it once the host is back.
    host.stop()
    try:
        form.locator("button[type=submit]").click()
        expect(page).to_have_url(re.compile(r"/deployments/\d+/$"))
        expect(page.locator(".message")).to_contain_text("Deployment web created")
        page.evaluate("window.__marker = 1")
        expect(page.locator("#replicas-table .badge[data-state=placed]")).to_have_count(1)
    finally:
        host.start()
    first = running_rows(page)
    expect(first).to_have_count(1, timeout=90_000)
    assert page.evaluate("window.__marker") == 1  # the same document: no reload
    deployment = Deployment.objects.get(name="web")
    replica = deployment.replicas.get()
    row = page.locator(f"tr[data-replica='{replica.pk}']")
    cells = row.locator("td")
    expect(cells.nth(2)).to_have_text(machine.name)
    expect(row).to_contain_text(f"Instance {replica.instance_id}")
    expect(row.locator(".uptime")).to_contain_text("up ")

    # Scale to 2: the form posts and comes back here (a new document); the second replica
    # comes up in that document by itself.
    page.locator("input[name=replicas]").fill("2")
    page.click("#scale-button")
    expect(page.locator(".message")).to_contain_text("Scaled to 2 replicas.")
    page.evaluate("window.__marker = 2")
    expect(running_rows(page)).to_have_count(2, timeout=90_000)
    assert page.evaluate("window.__marker") == 2
    for row in running_rows(page).all():
        expect(row.locator("td").nth(2)).to_have_text(machine.name)
    page.screenshot(path=str(SCREENSHOTS / "deployment-detail-2-running.png"), full_page=True)

    # Stopped, the deployment settles and the page stops polling.
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop-button")
    expect(page.locator("#deployment-state")).to_have_text("stopped")
    assert page.locator("#deployment-live").get_attribute("hx-trigger") is None
