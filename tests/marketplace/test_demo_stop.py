"""``make run``'s stop ends the rentals whose containers it is about to remove (``demo_stop``,
called by scripts/run.sh with the uuids its containers' labels give), so the next start finds
nothing missing to blame on a host, and the renter pays up to the stop, not for the time the
marketplace was down. Tried on a simulated host, with the containers found by label as the
script finds them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db.models import F
from django.utils import timezone

from billing.models import Hold
from hosts.services.heartbeats import CONTAINER_KILLED
from marketplace.management.commands.demo_stop import REASON
from marketplace.models import Rental
from scheduler.models import Instance
from scheduler.tasks import machines_reconcile
from tests.conftest import key_client, sim_container_label
from tests.marketplace.conftest import docker
from tests.marketplace.test_rental_lifecycle import rented

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def labelled_instances() -> list[str]:
    """The instance uuids of the containers carrying this run's label, as run.sh lists them
    (other tests' containers may be among them: their instances are not in this database)."""
    listed = docker(
        "ps", "-a", "--filter", f"label={sim_container_label()}",
        "--format", '{{.Label "gpumkt.instance"}}',
    )  # fmt: skip
    return listed.stdout.split()


def test_stopping_make_run_ends_its_rentals_and_blames_no_host(funded_team, machine, settings):
    settings.DEBUG = True
    instance = rented(key_client(funded_team), machine, duration_hours=2)
    ran = timedelta(minutes=10)  # it has been running a while when make run stops
    Rental.objects.filter(instance=instance).update(
        starts_at=F("starts_at") - ran, ends_at=F("ends_at") - ran,
        gpu_clock_since=F("gpu_clock_since") - ran,
        storage_clock_since=F("storage_clock_since") - ran,
    )  # fmt: skip
    reliability = machine.reliability
    assert str(instance.uuid) in labelled_instances()

    call_command("demo_stop", *labelled_instances())
    stopped_at = timezone.now()
    # What the script does next: remove every container of the run, whatever became of it.
    docker("rm", "-f", instance.container_name, check=False)
    machines_reconcile()  # the next start's first look at the host

    instance.refresh_from_db()
    assert instance.state == "destroyed", instance.status_message
    assert instance.events.filter(to_state="destroying", reason=REASON).count() == 1
    hold = Hold.objects.get(pk=instance.rental.hold_id)
    assert hold.status != "open"
    # Charged for the ten minutes it ran, to the stop; the rest of the two hours went back.
    rental = Rental.objects.get(instance=instance)
    assert 600 <= rental.gpu_seconds <= 660
    assert 0 < hold.captured_gpu < hold.amount // 10 < hold.released
    assert hold.captured_gpu + hold.captured_storage + hold.released == hold.amount
    assert rental.settled_at is not None and rental.settled_at <= stopped_at
    machine.refresh_from_db()
    assert not machine.events.filter(kind=CONTAINER_KILLED).exists()
    assert machine.reliability == reliability


def test_demo_stop_ends_nothing_without_debug(funded_team, machine, settings):
    instance = rented(key_client(funded_team), machine)
    settings.DEBUG = False

    with pytest.raises(CommandError) as refused:
        call_command("demo_stop", str(instance.uuid))

    assert "DEBUG" in str(refused.value)
    instance.refresh_from_db()
    assert instance.state == "running"
    assert Hold.objects.get(pk=instance.rental.hold_id).status == "open"


def test_demo_stop_passes_over_containers_that_are_no_rentals(funded_team, machine, settings):
    settings.DEBUG = True
    instance = rented(key_client(funded_team), machine)

    # A container of the run without the label (the gateway's firewall helper), and garbage.
    call_command("demo_stop", "", "not-a-uuid", "00000000-0000-0000-0000-000000000000")

    assert Instance.objects.get(pk=instance.pk).state == "running"
