"""Domain events of the billing room. Higher rooms subscribe; billing never imports them.

``balance_changed`` is sent after the transaction that changed a team's available, held or
earnings balance commits (never for a rolled-back change), with ``team_id``.
"""

from __future__ import annotations

from django.dispatch import Signal

balance_changed = Signal()  # kwargs: team_id: int
topup_credited = Signal()  # kwargs: team_id: int, topup_id: int, amount: int
