"""The renter console's action forms on a real rental (simulated host: real SSH, real Docker,
real ledger): run a command, extend, stop, start, destroy, each as the owner submits it from
the instance page, and what the page says back; bad input names the field and changes nothing."""

from __future__ import annotations

import html
import re
import subprocess
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from django.utils.dateformat import format as date_format

from billing.models import Hold
from billing.money import MICRO_PER_DOLLAR
from billing.selectors import team_balance
from marketplace.models import Offer, Rental
from marketplace.rentals.metering import rental_owed
from scheduler.models import GpuAllocation, Instance
from tests.conftest import client_for
from tests.marketplace.conftest import containers_named, docker_inspect

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

RENT_FORM = {
    "num_gpus": "1", "duration_hours": "2", "disk_gb": "10", "launch_mode": "entrypoint",
    "image": "gpumkt/busybox:latest", "entrypoint": "sh",
    # Exits at once on `docker stop` (a bare `sleep` as PID 1 ignores SIGTERM for 10 s).
    "args": "-c 'trap \"exit 0\" TERM; echo up; while :; do sleep 1; done'",
}  # fmt: skip


@pytest.fixture
def console(client, owner, funded_team):
    return client_for(client, owner, funded_team)


@pytest.fixture
def instance(console, machine) -> Instance:
    """Rented from the offers page's form, as the owner does it."""
    response = console.post(f"/offers/{machine.pk}/rent/", RENT_FORM, follow=True)
    instance = Instance.objects.get()
    assert response.redirect_chain == [(f"/instances/{instance.pk}/", 302)]
    assert page_messages(response) == [
        "Rented. The container is launching; this page updates by itself."
    ]
    assert instance.state == "running", instance.status_message
    return instance


def submit(console, instance: Instance, action: str, data: dict | None = None):
    """Post one of the instance page's forms and land where its redirect leads."""
    return console.post(f"/instances/{instance.pk}/{action}/", data or {}, follow=True)


def shown(response) -> str:
    return html.unescape(response.content.decode())


def page_messages(response) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'<li class="message [^"]*">(.*?)</li>',
                                                   response.content.decode())]  # fmt: skip


def badge(response) -> str:
    return re.search(r'id="state-badge" data-state="(\w+)"', response.content.decode()).group(1)


def live_gpus(instance: Instance) -> int:
    return GpuAllocation.objects.filter(instance=instance, released_at=None).count()


def running(container_id: str) -> bool:
    return docker_inspect(container_id)["State"]["Running"]


def exec_in(console, instance: Instance, command: str):
    return console.post(f"/instances/{instance.pk}/exec/", {"command": command})


def test_a_command_runs_in_the_container_and_its_output_is_shown(console, instance):
    page = console.get(f"/instances/{instance.pk}/").content.decode()
    assert f'hx-post="/instances/{instance.pk}/exec/"' in page and 'name="command"' in page

    response = exec_in(console, instance, "echo note-$((6*7)) > /tmp/note; cat /tmp/note")
    assert response.status_code == 200
    assert 'id="exec-text">note-42\n</pre>' in response.content.decode()
    assert "exit 0" in shown(response)
    # It ran in this rental's own container: the file is there.
    inside = subprocess.run(
        ["docker", "exec", instance.container_id, "cat", "/tmp/note"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert inside == "note-42\n"

    # A failing command: its exit status and stderr are shown, escaped, not rendered.
    response = exec_in(console, instance, "echo '<b>oops</b>' >&2; exit 3")
    body = response.content.decode()
    assert '<span class="badge bad">exit 3</span>' in body
    assert "&lt;b&gt;oops&lt;/b&gt;" in body and "<b>oops</b>" not in body

    # No command: said so, nothing run.
    for blank in ("", "   "):
        response = exec_in(console, instance, blank)
        assert response.status_code == 200
        assert '<p class="error">Type a command first.</p>' in response.content.decode()
        assert "exec-text" not in response.content.decode()
    response = exec_in(console, instance, "echo " + "x" * 4092)
    assert '<p class="error">The command is longer than 4096 characters.</p>' in shown(response)
    instance.refresh_from_db()
    assert instance.state == "running" and running(instance.container_id)


def test_extend_moves_the_end_and_holds_exactly_the_quote(console, instance, machine):
    rental = instance.rental
    hold = Hold.objects.get(pk=rental.hold_id)
    ends_before, held_before = rental.ends_at, hold.amount
    balance_before = team_balance(instance.team_id)
    # What the renter is quoted for 2 more hours of this rental (1 GPU, 10 GB).
    quote = console.get(
        f"/api/v1/offers/{machine.pk}/quote/?num_gpus=1&disk_gb=10&duration_hours=2"
    ).json()
    quoted = int(Decimal(quote["total"]) * MICRO_PER_DOLLAR)  # the API answers dollar strings
    assert quoted > 0

    response = submit(console, instance, "extend", {"hours": "2"})
    assert response.redirect_chain == [(f"/instances/{instance.pk}/", 302)]
    assert page_messages(response) == ["Extended by 2 hours."]
    rental.refresh_from_db()
    assert rental.ends_at == ends_before + timedelta(hours=2)
    assert date_format(rental.ends_at, "M j, H:i") in shown(response)  # the page's "Ends"
    assert Hold.objects.get(pk=rental.hold_id).amount == held_before + quoted
    balance = team_balance(instance.team_id)
    assert balance.held == balance_before.held + quoted
    assert balance.available == balance_before.available - quoted

    # Bad hours: the message names the field; the end, the hold and the balance stay put.
    refusals = {
        "-1": "hours: Extend by at least 0.01 and at most 8760 hours.",
        "0": "hours: Extend by at least 0.01 and at most 8760 hours.",
        "abc": "hours: Enter a number.",
        "": "hours: Enter a number.",
        "nan": "hours: Extend by at least 0.01 and at most 8760 hours.",
    }
    for hours, message in refusals.items():
        response = submit(console, instance, "extend", {"hours": hours})
        assert response.status_code == 200
        assert page_messages(response) == [message], hours
        rental.refresh_from_db()
        assert rental.ends_at == ends_before + timedelta(hours=2), hours
        assert Hold.objects.get(pk=rental.hold_id).amount == held_before + quoted, hours
        assert team_balance(instance.team_id) == balance, hours


def test_stop_start_destroy_from_the_instance_page(console, instance, machine, funded_team):
    free_before = Offer.objects.get(machine=machine, all_free=True).num_gpus
    rental = instance.rental
    page = console.get(f"/instances/{instance.pk}/")
    assert badge(page) == "running"
    assert 'id="stop-button"' in page.content.decode()
    assert 'id="start-button"' not in page.content.decode()

    # Starting what runs is refused, and says why.
    response = submit(console, instance, "start")
    assert page_messages(response) == ["An instance that is running cannot be started."]
    assert badge(response) == "running" and running(instance.container_id)

    response = submit(console, instance, "stop")
    assert page_messages(response) == [
        "Stopping: GPU time is no longer charged; the GPUs are free once the host has stopped "
        "the container. Storage is still charged."
    ]
    assert badge(response) == "stopped"
    assert 'id="start-button"' in response.content.decode()
    instance.refresh_from_db()
    assert instance.state == "stopped"
    assert not running(instance.container_id)
    assert live_gpus(instance) == 0
    assert Offer.objects.get(machine=machine, all_free=True).num_gpus == free_before + 1
    rental.refresh_from_db()
    assert rental.gpu_clock_since is None and rental.storage_clock_since is not None

    # Stopping again is refused; a command needs a running instance.
    response = submit(console, instance, "stop")
    assert page_messages(response) == ["An instance that is stopped cannot be stopped."]
    assert badge(response) == "stopped"
    refused = exec_in(console, instance, "echo hi").content.decode()
    assert '<p class="error">Commands run only in a running instance.</p>' in refused

    response = submit(console, instance, "start")
    assert page_messages(response) == ["Started."]
    assert badge(response) == "running"
    instance.refresh_from_db()
    assert instance.state == "running" and running(instance.container_id)
    assert live_gpus(instance) == 1
    assert Offer.objects.get(machine=machine, all_free=True).num_gpus == free_before
    assert "back-again" in shown(exec_in(console, instance, "echo back-again"))

    # Not an action: 404, nothing changes.
    assert console.post(f"/instances/{instance.pk}/reboot/").status_code == 404
    instance.refresh_from_db()
    assert instance.state == "running"

    response = submit(console, instance, "destroy")
    assert response.redirect_chain == [("/instances/", 302)]
    assert page_messages(response) == [
        "Destroying: the rental is settled now, and the container and its data are removed as "
        "soon as the host confirms."
    ]
    assert f'data-instance="{instance.pk}"' not in response.content.decode()  # off the list
    instance.refresh_from_db()
    assert instance.state == "destroyed"
    assert containers_named(instance.container_name) == []
    assert live_gpus(instance) == 0
    assert Offer.objects.get(machine=machine, all_free=True).num_gpus == free_before + 1
    rental = Rental.objects.get(pk=rental.pk)
    assert rental.settled_at is not None
    hold = Hold.objects.get(pk=rental.hold_id)
    # Settled: what the clocks say it used is captured, the rest went back to the renter.
    owed = rental_owed(rental, timezone.now())
    assert (hold.status, hold.captured_gpu, hold.captured_storage) == (
        "released", owed.gpu, owed.storage,
    )  # fmt: skip
    assert hold.released == hold.amount - owed.total
    assert team_balance(funded_team.pk).held == 0
    # Its page says so and offers no actions; the forms refuse.
    page = console.get(f"/instances/{instance.pk}/")
    assert badge(page) == "destroyed"
    assert f"/instances/{instance.pk}/stop/" not in page.content.decode()
    assert f"/instances/{instance.pk}/destroy/" not in page.content.decode()
    response = submit(console, instance, "stop")
    assert page_messages(response) == ["An instance that is destroyed cannot be stopped."]
    response = submit(console, instance, "extend", {"hours": "1"})
    assert page_messages(response) == ["hours: This rental has ended; rent again instead."]
    assert Hold.objects.get(pk=rental.hold_id).amount == hold.amount


def test_extend_by_a_sliver_of_an_hour_names_the_hours_field(console, instance):
    ends_before = instance.rental.ends_at
    response = submit(console, instance, "extend", {"hours": "0.0001"})
    [message] = page_messages(response)
    assert message.startswith("hours: "), message
    rental = Rental.objects.get(pk=instance.rental.pk)
    assert rental.ends_at == ends_before
