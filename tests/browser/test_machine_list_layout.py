"""A provider's machine list at a laptop's width (1400 px): every status and listing badge reads
as one word on one line ("Online", not "Onlin" / "e"), however many GPUs and long addresses
the other columns hold. The screenshot is kept under VAR_DIR for a person to look at."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.utils import timezone

from hosts.models import Gpu, Machine
from marketplace.models import Role
from tests.conftest import PASSWORD
from tests.factories import TeamFactory, UserFactory, add_member

SCREENSHOTS = Path(os.environ["VAR_DIR"])  # made by the live server fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# [text, lines] for each element the selector finds: the number of lines its text is laid out
# on (fragments whose tops are within a few pixels, like a <small> beside normal text, share
# a line).
LINES_OF = """
(selector) => Array.from(document.querySelectorAll(selector)).map((element) => {
  const range = document.createRange();
  range.selectNodeContents(element);
  const tops = Array.from(range.getClientRects()).map((r) => r.top).sort((a, b) => a - b);
  const lines = tops.filter((top, i) => i === 0 || top - tops[i - 1] > 6).length;
  return [element.textContent.trim(), lines];
})
"""


def a_busy_fleet(team) -> None:
    """Machines the way a provider's list looks in use: eight GPUs each, long names and
    addresses, online and listed, online and unlisted, offline."""
    for number, (status, listed) in enumerate(
        [("online", True), ("online", False), ("offline", True), ("online", True)]
    ):
        machine = Machine.objects.create(
            team=team,
            name=f"rack-{number}-a100-sxm4-80gb-frankfurt",
            address=f"gpu-node-{number}.frankfurt.datacenter.example.net",
            port=2222,
            ssh_user="gpumarket",
            status=status,
            listed=listed,
            price_per_gpu_hour=1_450_000,
            location="Frankfurt, DE",
            reliability=0.9987,
            last_heartbeat_at=timezone.now(),
        )
        Gpu.objects.bulk_create(
            Gpu(
                machine=machine,
                index=i,
                uuid=f"GPU-{number}-{i}",
                name="NVIDIA A100-SXM4-80GB",
                memory_mib=81920,
            )
            for i in range(8)
        )


def test_machine_list_badges_stay_whole_at_1400_px(page, live_server_url):
    from playwright.sync_api import expect

    team = TeamFactory(name="GPU Provider Inc")
    provider = UserFactory(username="provider")
    add_member(team, provider, Role.OWNER)
    a_busy_fleet(team)

    page.goto(f"{live_server_url}/accounts/login/")
    page.fill("input[name=username]", provider.username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.select_option("#team-select", str(team.pk))
    expect(page.locator("h1")).to_contain_text(team.name)
    page.goto(f"{live_server_url}/machines/")
    expect(page.locator("#machines-table tbody tr")).to_have_count(4)
    page.screenshot(path=str(SCREENSHOTS / "machine-list-1400.png"), full_page=True)

    badges = page.evaluate(LINES_OF, "#machines-table .badge")
    assert len(badges) == 8  # a status and a listing badge per machine
    assert {text for text, _ in badges} >= {"Online", "Offline", "listed", "unlisted"}
    assert [text for text, lines in badges if lines != 1] == [], "badges broken over lines"
    # The price reads as one amount too ("$1.45/GPU-h", not "$1.45/GP" / "U-h").
    prices = page.evaluate(LINES_OF, "#machines-table tbody td.num:nth-child(4)")
    assert prices == [["$1.45/GPU-h", 1]] * 4
