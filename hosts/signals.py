"""Domain events of the hosts room, for higher rooms. Sent after the change commits.

Keyword arguments of each (receivers should also accept ``**kwargs``):

- machine_status_changed(machine_id, team_id, old, new, reason): online/offline/key mismatch…
- machine_changed(machine_id, team_id, what): terms, listing, probed figures, maintenance,
  self-test or heartbeat figures changed (offers refresh; consoles re-render). ``what`` is one
  of "probe", "terms", "listing", "maintenance", "self_test", "heartbeat".
- machine_host_key_mismatch(machine_id, team_id, presented): the machine presented another
  host key than the pinned one; nothing runs on it until the provider pins a key again.
- gpu_missing(machine_id, gpu_uuid): a GPU the machine had is gone from nvidia-smi
"""

from __future__ import annotations

from django.dispatch import Signal

machine_status_changed = Signal()
machine_changed = Signal()
machine_host_key_mismatch = Signal()
gpu_missing = Signal()
