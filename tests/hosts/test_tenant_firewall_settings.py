"""The provider names the private ranges its rentals may not reach, on the machine page: a bad
range is refused naming the field, with nothing written; a good one is saved and the host's
rules follow at the probe queued with it. The page says whether the firewall is in place."""

from __future__ import annotations

import html

import pytest

from hosts.models import Machine

pytestmark = pytest.mark.django_db


@pytest.fixture
def machine(team) -> Machine:
    return Machine.objects.create(
        team=team, name="gpu-1", address="203.0.113.7", port=22, ssh_user="root",
        status="online", tenant_firewall=False,
        tenant_firewall_detail="Tenant firewall not installed: iptables is not installed",
    )  # fmt: skip


def test_a_bad_range_is_refused_naming_the_field_and_nothing_is_written(
    owner_client, machine, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as queued:
        page = owner_client.post(
            f"/machines/{machine.pk}/firewall/",
            {"blocked_ranges": "10.0.0.0/8, 10.0.0.0/33"},
            follow=True,
        )
    text = html.unescape(page.content.decode())
    assert "blocked_ranges" in text and "'10.0.0.0/33' is not an IPv4 range" in text
    machine.refresh_from_db()
    assert machine.blocked_ranges == [] and not queued
    assert not machine.events.filter(kind="blocked_ranges").exists()


def test_ranges_are_saved_and_a_probe_sets_the_rules_up(
    owner_client, machine, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as queued:
        page = owner_client.post(
            f"/machines/{machine.pk}/firewall/",
            {"blocked_ranges": "192.168.1.7/24\n10.0.0.0/8"},
            follow=True,
        )
    assert "Saved" in html.unescape(page.content.decode())
    machine.refresh_from_db()
    assert machine.blocked_ranges == ["192.168.1.0/24", "10.0.0.0/8"]
    assert len(queued) == 2  # the page's live update, and the probe that applies them
    event = machine.events.get(kind="blocked_ranges")
    assert event.message == "Rentals may not reach: 192.168.1.0/24, 10.0.0.0/8"
    # Emptied again: only the host and link-local addresses stay refused.
    owner_client.post(f"/machines/{machine.pk}/firewall/", {"blocked_ranges": ""})
    machine.refresh_from_db()
    assert machine.blocked_ranges == []


def test_the_machine_page_says_when_the_firewall_is_missing_and_why(owner_client, machine):
    page = html.unescape(owner_client.get(f"/machines/{machine.pk}/").content.decode())
    assert 'id="tenant-firewall"' in page and "missing" in page
    assert "iptables is not installed" in page
    Machine.objects.filter(pk=machine.pk).update(
        tenant_firewall=True, tenant_firewall_detail="Rentals cannot reach the host, 169.254.0.0/16"
    )
    page = html.unescape(owner_client.get(f"/machines/{machine.pk}/").content.decode())
    assert "in place" in page and "Rentals cannot reach the host, 169.254.0.0/16" in page
