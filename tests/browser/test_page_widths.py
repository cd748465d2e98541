"""Every console page at a phone's width (390 px) and a laptop's (1400 px): the page is never
wider than the window (a wide table scrolls in its own box), no word is broken over two lines
("gpumk" / "t/busybox", "rente" / "r"), and on a phone the navigation folds into a menu.

A screenshot of each page at each width goes to the test's own output folder (tmp_path), for a
person to look at; nothing is written to the repository."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.models import Cluster, Deployment
from marketplace.services.templates import template_create
from tests.browser.test_bid_flow import elsewhere
from tests.browser.test_machine_list_layout import a_busy_fleet
from tests.browser.test_rent_flow import log_in
from tests.conftest import key_client
from tests.marketplace.conftest import fund, machine_for

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]

WIDTHS = (390, 1400)

# The page's layout problems: wider than the window, and each word (a run of letters and
# digits) whose text is laid out on more than one line. Hidden text and scrolled logs are
# skipped; a break at a hyphen, slash or space is a normal line break, not a broken word.
LAYOUT_PROBLEMS = """
() => {
  const problems = [];
  const width = document.documentElement.scrollWidth;
  if (width > window.innerWidth) {
    // Name what sticks out: the widest elements past the window's edge that no scroll box holds.
    const held = (e) => { for (let a = e.parentElement; a; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== "visible") return true; } return false; };
    const out = Array.from(document.body.querySelectorAll("*"))
      .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1 && !held(e))
      .map((e) => `<${e.tagName.toLowerCase()} class="${e.className}">`);
    problems.push(`page is ${width} px wide: ${out.slice(-3).join(" ")}`);
  }
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const element = node.parentElement;
    if (!element || element.closest("script, style, pre, textarea, select, dialog:not([open])")) continue;
    if (!element.getClientRects().length) continue;
    for (const match of node.data.matchAll(/[\\p{L}\\p{N}_]{2,}/gu)) {
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      const tops = Array.from(range.getClientRects()).filter((r) => r.width > 0).map((r) => r.top);
      if (tops.length && Math.max(...tops) - Math.min(...tops) > 6) {
        problems.push(`"${match[0]}" broken in <${element.tagName.toLowerCase()}>`);
      }
    }
  }
  return problems;
}
"""


def a_console_with_everything(team, owner, provider_team, sim_host_factory):
    """A renter who is also a provider and the operator: a running instance, a deployment, a
    cluster, machines with long names and addresses, money on the account."""
    owner.is_staff = True
    owner.save(update_fields=["is_staff"])
    fund(team)
    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    a_busy_fleet(team)
    own_machine = team.machines.first()
    api = key_client(team)
    response = elsewhere(
        lambda: api.post(
            "/api/v1/instances/",
            {
                "machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
                "duration_hours": 2, "disk_gb": 1, "entrypoint": "sh",
                "args": ["-c", "echo a-long-log-line-without-spaces-" + "x" * 200 + "; sleep 600"],
            },
            format="json",
        )
    )  # fmt: skip
    assert response.status_code == 201, response.content
    deployment = Deployment.objects.create(
        team=team, name="inference-fleet-europe", image="gpumkt/busybox:latest", state="stopped"
    )
    cluster_deployment = Deployment.objects.create(
        team=team, name="serving-cluster", image="gpumkt/busybox:latest", state="stopped"
    )
    cluster = Cluster.objects.create(
        team=team, deployment=cluster_deployment, state="stopped",
        ends_at=timezone.now() + timedelta(hours=3),
    )  # fmt: skip
    template = template_create(
        team=team, user=None,
        fields={"name": "pytorch-notebook-with-a-long-name", "image": "gpumkt/busybox:latest",
                "args": ["-c", "echo " + "y" * 120], "env": {"MODE": "serve"}, "ports": [8080],
                "readme": "# Notebook\n" + "z" * 200, "public": True},
    )  # fmt: skip
    month = timezone.now().strftime("%Y-%m")
    return [
        "/", "/offers/", "/instances/", f"/instances/{response.json()['id']}/",
        "/deployments/", f"/deployments/{deployment.pk}/", "/clusters/", f"/clusters/{cluster.pk}/",
        "/volumes/", "/templates/", f"/templates/{template.pk}/", "/ssh-keys/", "/machines/", f"/machines/{own_machine.pk}/", "/machines/add/",
        "/earnings/", "/billing/", "/billing/invoices/", f"/billing/invoices/{month}/",
        "/team/", "/team/api-keys/", "/operator/",
    ]  # fmt: skip


def test_every_console_page_fits_a_phone_and_a_laptop(
    browser, live_server_url, team, owner, provider_team, sim_host_factory, tmp_path
):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    refused = []  # every request a page makes answers (the favicon was a 404 on every page)
    page.on("response", lambda r: r.status >= 400 and refused.append(f"{r.status} {r.url}"))
    paths = a_console_with_everything(team, owner, provider_team, sim_host_factory)
    # A fresh server's first page (imports, templates) took over the usual 20 s on a busy
    # two-core machine: that one load gets longer.
    page.goto(f"{live_server_url}/accounts/login/", timeout=120_000)
    log_in(page, live_server_url, owner, team)

    problems = {}
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for path in paths:
            page.goto(f"{live_server_url}{path}")
            page.wait_for_load_state("networkidle")
            name = path.strip("/").replace("/", "-") or "overview"
            page.screenshot(path=str(tmp_path / f"{name}-{width}.png"), full_page=True)
            found = page.evaluate(LAYOUT_PROBLEMS)
            if found:
                problems[f"{path} at {width} px"] = found[:5]
    # Signed out: the login page.
    context.clear_cookies()
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server_url}/accounts/login/")
        page.screenshot(path=str(tmp_path / f"login-{width}.png"), full_page=True)
        if found := page.evaluate(LAYOUT_PROBLEMS):
            problems[f"/accounts/login/ at {width} px"] = found
    assert problems == {}, f"screenshots in {tmp_path}"
    assert refused == []
    page.goto(f"{live_server_url}/favicon.ico")  # asked for by pages without an icon link
    assert page.evaluate("document.contentType") == "image/svg+xml"

    # On a phone the navigation is a menu: shut at first, open on its button, and the header's
    # Log out stays on the screen.
    log_in(page, live_server_url, owner, team)
    page.set_viewport_size({"width": 390, "height": 900})
    page.goto(f"{live_server_url}/instances/")
    sidebar = page.locator("#sidebar")
    expect(sidebar).to_be_hidden()
    page.click("#nav-toggle")
    expect(sidebar.get_by_role("link", name="Billing")).to_be_visible()
    logout = page.get_by_role("button", name="Log out")
    expect(logout).to_be_in_viewport()
    context.close()
