"""The console's Templates page in Chromium: a renter saves a template, edits it, rents from
it (the offers page's rent dialog comes filled in with its settings, and the rental launches
with them), sees another team's public template without Edit or Delete, and deletes their own."""

from __future__ import annotations

import re

import pytest

from marketplace.models import Template
from marketplace.services.templates import template_create
from scheduler.models import Instance
from tests.browser.test_rent_flow import log_in
from tests.factories import TeamFactory
from tests.marketplace.conftest import fund, machine_for

pytestmark = [pytest.mark.browser, pytest.mark.system, pytest.mark.django_db(transaction=True)]

ARGS = "-c 'echo from-the-template; sleep 600'"


def test_a_renter_saves_edits_rents_from_and_deletes_a_template(
    page, live_server_url, team, owner, sim_host_factory, provider_team
):
    from playwright.sync_api import expect

    machine = machine_for(sim_host_factory(gpus=2), provider_team)
    fund(team)
    shared = template_create(
        team=TeamFactory(name="Other Lab"),
        user=None,
        fields={"name": "their-public", "image": "gpumkt/busybox:latest", "public": True},
    )
    template_create(
        team=TeamFactory(name="Private Lab"),
        user=None,
        fields={"name": "their-private", "image": "gpumkt/busybox:latest"},
    )
    log_in(page, live_server_url, owner, team)
    page.get_by_role("link", name="Templates").click()
    expect(page.locator("h1")).to_have_text("Templates")
    listed = page.locator("#template-list")
    expect(listed).to_contain_text("their-public")
    expect(listed).not_to_contain_text("their-private")
    theirs = page.locator(f"tr[data-template='{shared.pk}']")
    expect(theirs.get_by_role("link", name="Edit")).to_have_count(0)
    expect(theirs.get_by_role("button", name="Delete")).to_have_count(0)

    # Save: a bad port is refused, saying so, with what was typed kept.
    form = page.locator("#template-form")
    form.locator("input[name=name]").fill("sleeper")
    form.locator("input[name=image]").fill("gpumkt/busybox:latest")
    form.locator("input[name=entrypoint]").fill("sh")
    form.locator("input[name=args]").fill(ARGS)
    form.locator("textarea[name=env]").fill("MODE=from template")
    form.locator("input[name=ports]").fill("http")
    form.locator("input[name=disk_gb]").fill("3")
    form.get_by_role("button", name="Save template").click()
    expect(page.locator(".message.error")).to_contain_text("not a port number")
    assert not Template.objects.filter(name="sleeper").exists()
    expect(form.locator("input[name=args]")).to_have_value(ARGS)
    form.locator("input[name=ports]").fill("8080")
    form.get_by_role("button", name="Save template").click()
    expect(page.locator(".message.success")).to_contain_text("Template sleeper saved")
    saved = Template.objects.get(team=team, name="sleeper")
    assert (saved.args, saved.env, saved.ports, saved.disk_gb) == (
        ["-c", "echo from-the-template; sleep 600"],
        {"MODE": "from template"},
        [8080],
        3,
    )

    # Edit: the form shows its settings as typed; the change is saved.
    mine = page.locator(f"tr[data-template='{saved.pk}']")
    mine.get_by_role("link", name="Edit").click()
    expect(page.locator("input[name=args]")).to_have_value(ARGS)
    page.fill("input[name=name]", "sleeper-2")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".message.success")).to_contain_text("Template sleeper-2 saved")

    # Rent from template: the offers page says so, and the dialog comes filled in.
    mine.get_by_role("link", name="Rent from template").click()
    expect(page.locator("#renting-from-template")).to_contain_text("sleeper-2")
    row = page.locator(f"tr[data-machine='{machine.pk}']").first
    row.locator(".rent-button").click()
    dialog = page.locator("#rent-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("input[name=image]")).to_have_value("gpumkt/busybox:latest")
    expect(dialog.locator("input[name=entrypoint]")).to_have_value("sh")
    expect(dialog.locator("input[name=args]")).to_have_value(ARGS)
    expect(dialog.locator("textarea[name=env]")).to_have_value("MODE=from template")
    expect(dialog.locator("input[name=ports]")).to_have_value("8080")
    expect(dialog.locator("input[name=disk_gb]")).to_have_value("3")
    dialog.locator("#rent-confirm").click()
    expect(page).to_have_url(re.compile(r"/instances/\d+/$"))
    instance = Instance.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    assert (instance.image, instance.entrypoint, instance.args, instance.disk_gb) == (
        "gpumkt/busybox:latest",
        "sh",
        ["-c", "echo from-the-template; sleep 600"],
        3,
    )
    assert instance.env["MODE"] == "from template"

    # Delete (after the browser's confirm): the row goes; the instance keeps its settings.
    page.goto(f"{live_server_url}/templates/")
    page.once("dialog", lambda d: d.accept())
    page.locator(f"tr[data-template='{saved.pk}']").get_by_role("button", name="Delete").click()
    expect(page.locator(".message.success")).to_contain_text("deleted")
    expect(page.locator(f"tr[data-template='{saved.pk}']")).to_have_count(0)
    assert not Template.objects.filter(pk=saved.pk).exists()
    assert Instance.objects.filter(pk=instance.pk, image="gpumkt/busybox:latest").exists()
