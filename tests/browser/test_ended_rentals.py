"""A destroyed rental stays in the team's history: the console's Ended list shows it with its
cost, how long it ran and why it ended; its page says it ended, shows the last lines its
container wrote (kept when the container was removed), and offers nothing that cannot work
(no exec box, no log follow, no socket that the server refuses). The API lists it with
``?state=ended``."""

from __future__ import annotations

import pytest

from scheduler.models import Instance, InstanceState
from tests.browser.test_bid_flow import elsewhere
from tests.browser.test_rent_flow import log_in
from tests.conftest import key_client
from tests.marketplace.conftest import fund, machine_for, until

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_a_destroyed_rental_is_listed_as_ended_with_its_last_logs(
    page, live_server_url, team, owner, sim_host_factory, provider_team
):
    from playwright.sync_api import expect

    machine = machine_for(sim_host_factory(gpus=1), provider_team)
    fund(team)
    api = key_client(team)
    rented = elsewhere(
        lambda: api.post(
            "/api/v1/instances/",
            {
                "machine_id": machine.pk, "num_gpus": 1, "image": "gpumkt/busybox:latest",
                "duration_hours": 2, "disk_gb": 1, "entrypoint": "sh",
                "args": ["-c", "echo last-words-of-the-run; exec sleep 600"],
            },
            format="json",
        )
    )  # fmt: skip
    assert rented.status_code == 201, rented.content
    instance_id = rented.json()["id"]
    until(lambda: Instance.objects.get(pk=instance_id).state == InstanceState.RUNNING, 60)

    def wrote_its_last_words() -> bool:
        logs = elsewhere(lambda: api.get(f"/api/v1/instances/{instance_id}/logs/"))
        return "last-words-of-the-run" in logs.json()["logs"]

    until(wrote_its_last_words, 30)
    assert elsewhere(lambda: api.delete(f"/api/v1/instances/{instance_id}/")).status_code == 202
    until(lambda: Instance.objects.get(pk=instance_id).state == InstanceState.DESTROYED, 60)

    # The API: gone from the default list, there with ?state=ended and ?state=all.
    def listed(query: str) -> list[int]:
        response = elsewhere(lambda: api.get(f"/api/v1/instances/{query}"))
        assert response.status_code == 200, response.content
        body = response.json()
        rows = body["results"] if isinstance(body, dict) else body
        return [row["id"] for row in rows]

    assert listed("") == []
    assert listed("?state=ended") == [instance_id]
    assert listed("?state=all") == [instance_id]
    assert listed("?state=running") == []
    refused = elsewhere(lambda: api.get("/api/v1/instances/?state=gone"))
    assert refused.status_code == 400
    assert "state" in refused.json()["error"]["fields"]

    sockets = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    log_in(page, live_server_url, owner, team)
    page.goto(f"{live_server_url}/instances/")
    expect(page.locator("#instances-table")).to_contain_text("No instances yet")
    page.get_by_role("link", name="Ended").click()
    row = page.locator(f"#instances-table tr[data-instance='{instance_id}']")
    expect(row.locator(".badge.state")).to_have_attribute("data-state", "destroyed")
    expect(row.locator(".end-reason")).to_contain_text("Destroyed by the renter")
    expect(row.locator(".final-cost")).to_contain_text("$")
    expect(row.locator(".ran-for")).to_contain_text(" s")
    page.get_by_role("link", name="All").click()
    expect(page.locator(f"#instances-table tr[data-instance='{instance_id}']")).to_be_visible()

    page.goto(f"{live_server_url}/instances/{instance_id}/")
    expect(page.locator("#ended-note")).to_contain_text("This rental has ended")
    expect(page.locator("#ended-note")).to_contain_text("Destroyed by the renter")
    expect(page.locator("#log-text")).to_contain_text("last-words-of-the-run")
    expect(page.locator("#logs")).not_to_contain_text("No such container")
    expect(page.locator("#logs")).to_contain_text("last lines it wrote")
    expect(page.locator("#exec-card")).to_have_count(0)
    expect(page.locator("#follow-logs")).to_have_count(0)
    expect(page.locator("#instance-status")).not_to_contain_text("ends in")
    page.wait_for_load_state("networkidle")
    assert [url for url in sockets if "/ws/instances/" in url] == []
