"""Extending a rental: more hours on its end date and as much more on its hold, within the
machine's end date and before its next maintenance window."""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import transaction

from billing import holds
from hosts.selectors import maintenance_overlapping
from marketplace.models import Rental
from marketplace.rentals.clocks import ENDED_STATES
from marketplace.rentals.locking import machine_and_rental_locked
from marketplace.rentals.terms import MAX_RENTAL_HOURS, MIN_RENTAL_HOURS
from marketplace.services.pricing import extension_quote


def rental_extend(*, rental: Rental, hours: float) -> Rental:
    """Add ``hours`` to the rental and as much to its hold (402 if credit is short)."""
    if not (MIN_RENTAL_HOURS <= hours <= MAX_RENTAL_HOURS):  # (NaN fails both)
        raise ValidationError(
            {
                "hours": f"Extend by at least {MIN_RENTAL_HOURS} and at most {MAX_RENTAL_HOURS} hours."
            }
        )
    with transaction.atomic():
        # Its end date and maintenance windows cannot move while this checks them.
        machine, rental = machine_and_rental_locked(rental)
        if rental.settled_at is not None or rental.instance.state in ENDED_STATES:
            raise ValidationError({"hours": "This rental has ended; rent again instead."})
        new_end = rental.ends_at + timedelta(hours=hours)
        if machine.end_date and new_end > machine.end_date:
            raise ValidationError(
                {"hours": f"The machine is offered until {machine.end_date:%Y-%m-%d %H:%M} UTC."}
            )
        window = maintenance_overlapping(machine.pk, rental.ends_at, new_end)
        if window is not None:
            raise ValidationError(
                {
                    "hours": f"The machine has maintenance from {window.starts_at:%Y-%m-%d %H:%M}"
                    " UTC; extend to before it."
                }
            )
        quote = extension_quote(rental, round(hours * 3600))
        holds.hold_extend(
            hold_id=rental.hold_id,
            amount=quote.total,
            idempotency_key=f"rental:{rental.instance.uuid}:extend:{new_end.isoformat()}",
        )
        rental.ends_at = new_end
        rental.save(update_fields=["ends_at"])
    return rental
