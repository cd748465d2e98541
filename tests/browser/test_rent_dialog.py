"""The rent dialog in Chromium: only the chosen kind's fields show, the bid note names the
lowest bid, the defaults fit the chosen offer, so *Rent now* works at once on a machine that
offers less disk than the usual default, and SSH mode warns before renting when no one could
log in (no team SSH key, an image without sshd)."""

from __future__ import annotations

import re

import pytest

from hosts.models import Machine
from marketplace.models import Rental
from marketplace.services.offers import offer_refresh
from tests.browser.test_rent_flow import log_in
from tests.marketplace.conftest import fund, machine_for

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_rent_dialog_shows_the_chosen_kind_and_its_defaults_rent_at_once(
    page, live_server_url, celery_worker, team, owner, sim_host_factory, provider_team
):
    from playwright.sync_api import expect

    machine = machine_for(
        sim_host_factory(gpus=2), provider_team, min_bid_price_per_gpu_hour=200_000
    )
    # 6 GB free for two GPUs: 3 GB per GPU, less than the dialog's usual 10 GB.
    Machine.objects.filter(pk=machine.pk).update(disk_free_gb=6)
    offer_refresh(machine_id=machine.pk)
    fund(team)
    # A fresh server's first page (imports, templates) while the worker starts beside it took
    # over the usual 20 s on a busy two-core machine: that one load gets longer.
    page.goto(f"{live_server_url}/accounts/login/", timeout=120_000)
    log_in(page, live_server_url, owner, team)

    page.goto(f"{live_server_url}/offers/?q=machine_id%3D{machine.pk}")
    page.locator(f"tr[data-machine='{machine.pk}'] .rent-button[data-gpus='1']").click()
    dialog = page.locator("#rent-dialog")
    expect(dialog).to_be_visible()
    # Whole GPUs: neither the bid's nor the slice's fields.
    expect(dialog.locator("input[name=rent_kind][value=whole]")).to_be_checked()
    expect(dialog.locator("#bid-fields")).to_be_hidden()
    expect(dialog.locator("#slice-fields")).to_be_hidden()
    expect(dialog.locator("input[name=disk_gb]")).to_have_value("3")
    expect(page.locator("#rent-price .error")).to_have_count(0)
    expect(page.locator("#rent-confirm")).to_be_enabled()

    # Bid: its fields, with the lowest bid named; still no slice fields.
    dialog.locator("input[name=rent_kind][value=bid]").check()
    expect(dialog.locator("#bid-fields")).to_be_visible()
    expect(dialog.locator("#bid-fields")).to_contain_text("The lowest bid now is $0.20.")
    expect(dialog.locator("#slice-fields")).to_be_hidden()
    dialog.locator("input[name=rent_kind][value=whole]").check()
    expect(dialog.locator("#bid-fields")).to_be_hidden()

    # SSH mode warns before renting: the team has no SSH key, and busybox has no sshd.
    warning = dialog.locator("#ssh-warning")
    expect(warning).to_be_hidden()
    dialog.locator("select[name=launch_mode]").select_option("ssh")
    expect(warning).to_contain_text("Your team has no SSH key")
    expect(warning.locator("#ssh-no-sshd")).to_be_visible()
    warning.get_by_role("button", name="Use gpumkt/sshbox:latest").click()
    expect(dialog.locator("input[name=image]")).to_have_value("gpumkt/sshbox:latest")
    expect(warning.locator("#ssh-no-sshd")).to_be_hidden()
    expect(warning).to_contain_text("Your team has no SSH key")
    dialog.locator("select[name=launch_mode]").select_option("entrypoint")
    expect(warning).to_be_hidden()
    dialog.locator("input[name=image]").fill("gpumkt/busybox:latest")

    # The defaults rent as they are.
    dialog.locator("#rent-confirm").click()
    expect(page).to_have_url(re.compile(r"/instances/\d+/$"))
    rental = Rental.objects.get(instance_id=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    assert (rental.disk_gb, rental.gpu_count, rental.interruptible) == (3, 1, False)
