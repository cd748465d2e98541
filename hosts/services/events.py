"""The machine's history and status: every write of the room records an event, changes status
through ``set_status`` and announces changes on commit (signals the higher rooms subscribe to)."""

from __future__ import annotations

from django.db import transaction

from hosts import ssh
from hosts.models import Machine, MachineEvent, MachineStatus
from hosts.signals import machine_changed, machine_host_key_mismatch, machine_status_changed


def record_event(machine: Machine, kind: str, message: str) -> None:
    MachineEvent.objects.create(machine=machine, kind=kind, message=message[:500])


def set_status(machine: Machine, new: str, reason: str) -> None:
    """Change status and record why; signal on commit. Call inside a transaction."""
    old = machine.status
    if old == new:
        return
    machine.status = new
    machine.status_detail = reason[:500]
    machine.save(update_fields=["status", "status_detail"])
    record_event(machine, "status", f"{old} → {new}: {reason}")
    payload = {
        "machine_id": machine.pk,
        "team_id": machine.team_id,
        "old": old,
        "new": new,
        "reason": reason,
    }
    transaction.on_commit(lambda: machine_status_changed.send_robust(sender=Machine, **payload))
    if new == MachineStatus.KEY_MISMATCH:
        # The pool refuses a flagged machine by its status too; this also closes a connection
        # opened before the key changed, in this process at once.
        transaction.on_commit(lambda: ssh.pool.forget(payload["machine_id"]))
        presented = machine.offered_key_fingerprint
        transaction.on_commit(
            lambda: machine_host_key_mismatch.send_robust(
                sender=Machine,
                machine_id=payload["machine_id"],
                team_id=payload["team_id"],
                presented=presented,
            )
        )


def notify_changed(machine: Machine, what: str) -> None:
    machine_id, team_id = machine.pk, machine.team_id
    transaction.on_commit(
        lambda: machine_changed.send_robust(
            sender=Machine, machine_id=machine_id, team_id=team_id, what=what
        )
    )
