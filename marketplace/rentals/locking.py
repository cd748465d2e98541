"""The lock order a change to one rental keeps: its machine first, then the rental.

Renting and changing a machine's terms lock the machine, so its end date, maintenance windows
and bids cannot move while a rental's change is checked against them. The rental is locked
alone (``of``: a join would lock its instance too, in no order we choose), with its instance
read beside it.
"""

from __future__ import annotations

from hosts.models import Machine
from marketplace.models import Rental


def machine_and_rental_locked(rental: Rental) -> tuple[Machine, Rental]:
    """The rental's machine and the rental, read afresh and locked in that order (call inside
    a transaction)."""
    machine = Machine.objects.select_for_update().get(pk=rental.machine_id)
    locked = (
        Rental.objects.select_for_update(of=("self",)).select_related("instance").get(pk=rental.pk)
    )
    return machine, locked
