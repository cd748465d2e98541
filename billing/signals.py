"""Domain events of the billing room. Higher rooms subscribe; billing never imports them.

``balance_changed`` is sent after the transaction that changed a team's available, held or
earnings balance commits (never for a rolled-back change), with ``team_ids``: every team a
transaction changed, in one signal (a batch of placements or a metering sweep touches
hundreds, and a subscriber reads them all at once).
"""

from __future__ import annotations

from django.dispatch import Signal

balance_changed = Signal()  # kwargs: team_ids: list[int]
topup_credited = Signal()  # kwargs: team_id: int, topup_id: int, amount: int
