"""Domain events of the scheduler, for higher rooms (the marketplace meters and pushes them).

Sent after the transaction that made the change commits.
"""

from __future__ import annotations

from django.dispatch import Signal

# kwargs: instance_id, team_id, machine_id, from_state, to_state, reason, launched_as_asked
# (True when a launch started the container it was asked for: nothing changed hands)
instance_state_changed = Signal()

# kwargs: instance_id, team_id, progress (0-100), message
instance_progress = Signal()
