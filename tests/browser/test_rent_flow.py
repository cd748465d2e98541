"""A renter in Chromium: log in, search, rent, watch it turn running live, follow its log,
stop it live; and a second console's instance list that updates by itself.

The web server (uvicorn) and a Celery worker run as real processes, so the launch happens in
the worker and the page learns of it only through the WebSocket. The machine's sshd is down
while renting, so the launch cannot finish before the page has shown "launching"; it is
started once the page shows it, and the worker's retry launches the container. A script
injected before any page script records every state the badge shows and a per-document id,
so the test proves the badge changed in the same document, without a reload.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import PASSWORD
from tests.marketplace.conftest import fund, machine_for

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]

# Runs in every new document before its own scripts: a random id for the document, and the
# list of states the instance badge (or the instance rows' badges) showed, in order.
RECORD_BADGES = """
window.__documentId = Math.random().toString(36).slice(2);
window.__badgeStates = [];
window.__rowStates = [];
document.addEventListener("DOMContentLoaded", function () {
  function push(list, value) { if (value && list[list.length - 1] !== value) list.push(value); }
  function record() {
    var badge = document.getElementById("state-badge");
    if (badge) push(window.__badgeStates, badge.dataset.state);
    var row = document.querySelector("#instances-table tr[data-instance] .badge.state");
    if (row) push(window.__rowStates, row.dataset.state);
  }
  record();
  new MutationObserver(record).observe(document.body, {
    subtree: true, childList: true, attributes: true, attributeFilter: ["data-state"],
  });
});
"""

# Quoted as in a shell: the console splits it into ["-c", "env; i=0; while …"]. Prints its
# environment, then tick-0, tick-1, … once a second.
ARGS = "-c 'env; i=0; while :; do echo tick-$i; i=$((i+1)); sleep 1; done'"


def log_in(page, live_server_url, user, team) -> None:
    from playwright.sync_api import expect

    page.goto(f"{live_server_url}/accounts/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_contain_text(f"{user.username}'s team")  # personal first
    page.select_option("#team-select", str(team.pk))  # the header switcher submits on change
    expect(page.locator("h1")).to_contain_text(team.name)


def rent_from_offers(page, live_server_url, machine) -> None:
    from playwright.sync_api import expect

    page.goto(f"{live_server_url}/offers/")
    page.fill("input[name=q]", "gpu_name=RTX_4090 num_gpus=2 -o dph_total")  # its 2-GPU bundle
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
    dialog.locator("input[name=args]").fill(ARGS)
    dialog.locator("textarea[name=env]").fill("MARKER=hello-from-the-browser")
    dialog.locator("#rent-confirm").click()


def ticks(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"tick-(\d+)", text)]


def test_renter_rents_watches_it_run_follows_the_log_and_stops_it_live(
    page, live_server_url, celery_worker, team, owner, sim_host_factory, provider_team
):
    from playwright.sync_api import expect

    host = sim_host_factory(gpus=2)
    machine = machine_for(host, provider_team)
    fund(team)
    page.add_init_script(RECORD_BADGES)
    log_in(page, live_server_url, owner, team)

    host.stop()  # the launch waits for the machine: the page must show it launching first
    try:
        rent_from_offers(page, live_server_url, machine)
        expect(page).to_have_url(re.compile(r"/instances/\d+/$"))
        badge = page.locator("#state-badge")
        expect(badge).to_have_attribute("data-state", "launching")
        logs = page.locator("#logs")
        expect(logs).to_contain_text("The container has not started yet")
    finally:
        host.start()
    document = page.evaluate("window.__documentId")
    expect(page.locator("#live-dot")).to_have_class(re.compile("on"))
    expect(badge).to_have_attribute("data-state", "running", timeout=90_000)
    assert page.evaluate("window.__documentId") == document  # no reload
    assert page.evaluate("window.__badgeStates") == ["launching", "running"]
    # The Logs panel, read while launching ("not started yet"), reads the log again by itself
    # once the container runs: its first output, without a reload or a click.
    expect(logs).not_to_contain_text("has not started")
    expect(logs).to_contain_text("MARKER=hello-from-the-browser")
    assert page.evaluate("window.__documentId") == document

    # Follow: the last lines, then each new one as the container writes it (once a second).
    page.check("#follow-logs")
    log = page.locator("#log-text")
    expect(log).to_contain_text("MARKER=hello-from-the-browser")
    expect(log).to_contain_text("tick-")
    latest = max(ticks(log.inner_text()))
    expect(log).to_contain_text(f"tick-{latest + 2}", timeout=20_000)
    seen = ticks(log.inner_text())
    assert seen == list(range(seen[0], seen[-1] + 1))  # each line once, in order
    # The tail view is still there, and reading it stops the follow.
    page.click("#logs-tail")
    expect(page.locator("#follow-logs")).not_to_be_checked()
    expect(log).to_contain_text("MARKER=hello-from-the-browser")

    # Stop: the form posts and comes back to this page (a new document) showing "stopping";
    # the container takes its 10 s grace to stop, and the badge turns "stopped" in that
    # document by itself.
    page.click("#stop-button")
    expect(page.locator(".message")).to_contain_text("Stopping")
    document = page.evaluate("window.__documentId")
    expect(badge).to_have_attribute("data-state", "stopped", timeout=60_000)
    assert page.evaluate("window.__documentId") == document
    assert page.evaluate("window.__badgeStates") == ["stopping", "stopped"]
    expect(page.locator("#start-button")).to_be_visible()


def test_instance_list_shows_a_new_rental_and_its_launch_without_a_reload(
    page, live_server_url, celery_worker, team, owner, sim_host_factory, provider_team
):
    from playwright.sync_api import expect

    host = sim_host_factory(gpus=2)
    machine = machine_for(host, provider_team)
    fund(team)
    page.add_init_script(RECORD_BADGES)
    log_in(page, live_server_url, owner, team)
    page.goto(f"{live_server_url}/instances/")
    expect(page.locator("#instances-table")).to_contain_text("No instances yet")
    expect(page.locator("#live-dot")).to_have_class(re.compile("on"))
    document = page.evaluate("window.__documentId")

    other_console = page.context.new_page()  # the same renter, in another tab
    host.stop()
    try:
        rent_from_offers(other_console, live_server_url, machine)
        expect(other_console).to_have_url(re.compile(r"/instances/\d+/$"))
        row_badge = page.locator("#instances-table tr[data-instance] .badge.state")
        expect(row_badge).to_have_attribute("data-state", "launching")
    finally:
        host.start()
    expect(row_badge).to_have_attribute("data-state", "running", timeout=90_000)
    assert page.evaluate("window.__documentId") == document
    assert page.evaluate("window.__rowStates") == ["launching", "running"]
    other_console.close()
