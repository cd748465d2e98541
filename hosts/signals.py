"""Domain events of the hosts room, for higher rooms. Sent after the change commits.

- machine_status_changed(machine_id, team_id, old, new, reason): online/offline/key mismatch…
- machine_changed(machine_id): terms, listing or probed figures changed (offers refresh)
- gpu_missing(machine_id, gpu_uuid): a GPU the machine had is gone from nvidia-smi
"""

from __future__ import annotations

from django.dispatch import Signal

machine_status_changed = Signal()
machine_changed = Signal()
gpu_missing = Signal()
