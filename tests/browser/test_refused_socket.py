"""The console stops retrying a socket the server refused (issue 30 §5), in Chromium against
the real server (uvicorn), whose Origin check the page's own sockets pass.

The instance is destroyed between the page's rendering and its socket's connect: the socket is
refused (4404) and the page must not open another. The server used to refuse it at the
handshake (HTTP 403, which the browser reports as 1006, like a network failure), and the page
retried it every few seconds for as long as it stayed open.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.browser.test_rent_flow import log_in
from tests.factories import TeamFactory

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]

# Long enough for the page's first retries (0.5, 1, 2 s apart) had it kept retrying.
WATCH_MS = 4500

# Runs before the page's scripts: records each socket the page opens, how it closed, and
# whether the server greeted it.
RECORD_SOCKETS = """
window.__sockets = [];
window.__socketObjects = [];
(function () {
  var Native = window.WebSocket;
  function Recorded(url, protocols) {
    var socket = protocols ? new Native(url, protocols) : new Native(url);
    var record = {url: url, code: null, hello: false};
    window.__sockets.push(record);
    window.__socketObjects.push(socket);
    socket.addEventListener("close", function (event) { record.code = event.code; });
    socket.addEventListener("message", function (event) {
      if (String(event.data).indexOf('"hello"') !== -1) record.hello = true;
    });
    return socket;
  }
  Recorded.prototype = Native.prototype;
  ["CONNECTING", "OPEN", "CLOSING", "CLOSED"].forEach(function (k) { Recorded[k] = Native[k]; });
  window.WebSocket = Recorded;
})();
"""


def rented_instance(team):
    """A running rental's rows (nothing launches: the web server has no worker here)."""
    from billing.credits import credit_grant
    from billing.holds import hold_create
    from marketplace.models import Rental
    from scheduler.models import Instance
    from tests.marketplace.test_api_number_inputs import machine_for_sale

    provider = TeamFactory(name="Provider")
    machine = machine_for_sale(provider, "refused-socket", gpus=1)
    instance = Instance.objects.create(
        team=team, machine=machine, gpu_count=1, image="busybox", state="running"
    )
    credit_grant(team_id=team.pk, amount=10**8, reason="t", idempotency_key="refused-socket")
    hold = hold_create(
        team_id=team.pk, provider_team_id=provider.pk, amount=10**7,
        reference=f"rental:{instance.pk}", idempotency_key=f"hold-{instance.pk}",
        machine_reference=f"machine:{machine.pk}",
    )  # fmt: skip
    now = timezone.now()
    Rental.objects.create(
        team=team, provider_team=provider, machine=machine, instance=instance, gpu_count=1,
        price_per_gpu_hour=machine.price_per_gpu_hour,
        storage_price_per_gb_month=machine.storage_price_per_gb_month, disk_gb=10,
        starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=5), hold_id=hold.pk,
    )  # fmt: skip
    return instance


def test_a_refused_instance_socket_is_not_retried(page, live_server_url, team, owner):
    from scheduler.models import Instance

    instance = rented_instance(team)
    log_in(page, live_server_url, owner, team)
    page.add_init_script(RECORD_SOCKETS)

    page.goto(f"{live_server_url}/instances/{instance.pk}/")
    greeted = "window.__sockets.filter(s => s.hello).length === 2"
    page.wait_for_function(greeted)  # the page's two sockets: the team feed, the instance
    # The instance is destroyed; the page's socket drops (as on a network blip) and the page
    # connects again, to be refused.
    Instance.objects.filter(pk=instance.pk).update(state="destroyed")
    page.evaluate(
        "window.__socketObjects.filter(s => s.url.indexOf('/ws/instances/') !== -1)"
        ".forEach(s => s.close())"
    )
    page.wait_for_timeout(WATCH_MS)  # watching for retries that must not come

    sockets = page.evaluate("window.__sockets")
    instance_sockets = [s for s in sockets if f"/ws/instances/{instance.pk}/" in s["url"]]
    # The first, closed by the page (1005: no code); the second refused, and no more.
    assert [s["code"] for s in instance_sockets] == [1005, 4404], sockets
    # The page's team feed was let in: a real browser's Origin is the server's own.
    assert [s["hello"] for s in sockets if "/ws/events/" in s["url"]] == [True], sockets
