"""What ``make run`` does as it stops, before it removes the containers it made: it ends those
containers' rentals through the platform, as a renter's destroy does (settled at this moment:
nothing is charged after it), and a worker, now or at the next start, confirms the containers
are gone.

Why: the stop removes those containers (``docker rm -f`` by the run's label). Left running in
the records, the next start finds them missing and records on each machine that its host
killed a rental's container, which counts against the machine's reliability for its window:
the demo's own shutdown blamed on its hosts, and its cheapest card dropped from the default
(verified) search. The renter is not charged for the time the marketplace was down either.

Runs only with DEBUG on, as ``demo_data``: it ends rentals.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from marketplace.rentals.actions import rental_destroy_request
from scheduler.models import Instance, InstanceState

REASON = "Ended: the local marketplace (make run) stopped and removed its containers"


class Command(BaseCommand):
    help = (
        "End the rentals of the instances named (their containers' gpumkt.instance label), "
        "as make run does before it removes its containers."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "instances", nargs="*", help="instance uuids, as the containers' labels give them"
        )

    def handle(self, *args, instances: list[str], **options):
        if not settings.DEBUG:
            raise CommandError(
                "demo_stop ends rentals and is for make run's local marketplace: it runs only "
                "with DEBUG=1."
            )
        uuids = set()
        for text in instances:
            try:
                uuids.add(uuid.UUID(text))
            except ValueError:
                continue  # a container of ours that is not an instance's (no label)
        ending = Instance.objects.filter(uuid__in=uuids).exclude(
            state__in=[InstanceState.DESTROYING, InstanceState.DESTROYED]
        )
        ended = 0
        for instance in ending:
            rental_destroy_request(instance=instance, reason=REASON)
            ended += 1
        if ended:
            self.stdout.write(f"==> ended {ended} rental(s) whose containers are being removed")
