"""Connecting a machine: register its address, read and pin its host key, flag a changed key,
and remove a machine never rented.

SSH happens outside transactions (a slow machine must not hold row locks); each write after
it is a short transaction that re-reads the row.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone

from hosts import addresses, ssh
from hosts.models import Machine, MachineStatus
from hosts.services.events import record_event, set_status
from hosts.user_text import name_problem

logger = logging.getLogger(__name__)


@transaction.atomic
def machine_register(*, team_id: int, name: str, address: str, port: int, ssh_user: str) -> Machine:
    errors = {}
    if (problem := name_problem(name.strip(), max_length=80, required=False)) is not None:
        errors["name"] = problem
    address, port = _address_and_port(address.strip(), port)
    if (
        not address
        or any(c.isspace() for c in address)
        or address.startswith("-")
        or len(address) > 255
    ):
        errors["address"] = f"{addresses.ADDRESS_HINT}."
    elif (refused := addresses.address_refusal(address)) is not None:
        errors["address"] = f"The platform does not connect to {refused}."
    elif (problem := addresses.address_syntax_problem(address)) is not None:
        errors["address"] = problem
    if not (1 <= port <= 65535):
        errors["port"] = "An SSH port between 1 and 65535."
    if (
        not ssh_user
        or not ssh_user.replace("-", "").replace("_", "").replace(".", "").isalnum()
        or ssh_user.startswith("-")
    ):
        errors["ssh_user"] = "A user name: letters, digits, '-', '_', '.'."
    if not errors and Machine.objects.filter(team_id=team_id, address=address, port=port).exists():
        errors["address"] = "Your team has already registered this address and port."
    if errors:
        raise ValidationError(errors)
    machine = Machine.objects.create(
        team_id=team_id, name=(name.strip() or address)[:80], address=address, port=port,
        ssh_user=ssh_user,
    )  # fmt: skip
    record_event(machine, "registered", f"Registered {ssh_user}@{address}:{port}")
    return machine


def _address_and_port(address: str, port: int) -> tuple[str, int]:
    """``host:2222`` (or ``[v6]:2222``) typed into the address: the port is taken from it."""
    host, colon, typed = address.rpartition(":")
    if colon and typed.isdigit() and (host.count(":") == 0 or host.startswith("[")):
        if host.startswith("[") and not host.endswith("]"):
            return address, port
        return host, int(typed)
    return address, port


# How long a first contact may take before heartbeats try it again.
FIRST_CONTACT_GRACE = timedelta(minutes=1)


def machines_never_reached(now: datetime | None = None) -> list[int]:
    """Machines registered a while ago whose host key was never read: the first contact's task
    was lost. Reading a key again is harmless (nothing is trusted until confirmed)."""
    now = now or timezone.now()
    return list(
        Machine.objects.filter(
            status=MachineStatus.PENDING,
            host_key="",
            offered_key="",
            created_at__lt=now - FIRST_CONTACT_GRACE,
        ).values_list("pk", flat=True)
    )


def machine_fetch_host_key(*, machine_id: int) -> Machine:
    """Connect (without trusting) and remember the key the machine offers, for confirmation."""
    machine = Machine.objects.get(pk=machine_id)
    try:
        key = ssh.fetch_host_key(machine.address, machine.port)
    except ssh.HostUnreachable as error:
        with transaction.atomic():
            machine = Machine.objects.select_for_update().get(pk=machine_id)
            if machine.host_key:
                # A machine already set up keeps its status: heartbeats judge reachability.
                record_event(machine, "key_read", f"Could not read the host key again: {error}")
            else:
                set_status(machine, MachineStatus.ERROR, str(error))
        return machine
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        machine.offered_key_type, machine.offered_key = key.key_type, key.key_base64
        machine.offered_key_fingerprint = key.fingerprint
        machine.save(update_fields=["offered_key_type", "offered_key", "offered_key_fingerprint"])
        if not machine.host_key:
            set_status(machine, MachineStatus.AWAITING_CONFIRMATION, f"Presented {key.fingerprint}")
        elif machine.host_key != key.key_base64:
            set_status(machine, MachineStatus.KEY_MISMATCH, f"Now presents {key.fingerprint}")
        elif machine.status == MachineStatus.KEY_MISMATCH:
            # Even the old key back does not clear the flag by itself: a person decides.
            record_event(
                machine,
                "key_read",
                f"The machine presents the pinned key {key.fingerprint} again; confirm it to "
                "bring the machine back.",
            )
    return machine


@transaction.atomic
def machine_confirm_host_key(*, machine_id: int, fingerprint: str) -> Machine:
    """Pin the offered key, if the provider confirms the fingerprint they saw.

    Only the key the machine itself presented (read without trusting it) can be pinned, and
    only by repeating its fingerprint, so a provider never pins a key they were not shown.
    After a key change this is also how a provider accepts the machine's new key.
    """
    machine = Machine.objects.select_for_update().get(pk=machine_id)
    if not machine.offered_key or machine.offered_key_fingerprint != fingerprint.strip():
        raise ValidationError({"fingerprint": "This is not the fingerprint the machine presented."})
    previous = machine.host_key_fingerprint
    machine.host_key_type, machine.host_key = machine.offered_key_type, machine.offered_key
    machine.host_key_fingerprint = machine.offered_key_fingerprint
    machine.heartbeat_misses = 0
    machine.probe_attempted_at = None  # probe at once (the next heartbeat will, if nothing else)
    machine.save(
        update_fields=[
            "host_key_type", "host_key", "host_key_fingerprint", "heartbeat_misses",
            "probe_attempted_at",
        ]
    )  # fmt: skip
    if previous and previous != machine.host_key_fingerprint:
        record_event(machine, "key_pinned", f"New host key {fingerprint} pinned (was {previous})")
    else:
        record_event(machine, "key_pinned", f"Host key {fingerprint} confirmed and pinned")
    set_status(machine, MachineStatus.PENDING, "Host key pinned; probing")
    # The pool notices the new key itself (it is part of a connection's identity).
    return machine


@transaction.atomic
def machine_flag_key_mismatch(*, machine_id: int, presented: ssh.RemoteHostKey) -> None:
    """Mark a machine whose host key changed; remember the new key for the provider to judge.

    Registered with the SSH pool (hosts.apps), so the first command of any room that meets a
    changed key flags the machine. The pinned key is kept: nothing runs until a person pins
    a key again.
    """
    machine = Machine.objects.select_for_update().filter(pk=machine_id).first()
    if machine is None or machine.host_key == presented.key_base64:
        return
    if machine.offered_key != presented.key_base64:
        machine.offered_key_type, machine.offered_key = presented.key_type, presented.key_base64
        machine.offered_key_fingerprint = presented.fingerprint
        machine.save(update_fields=["offered_key_type", "offered_key", "offered_key_fingerprint"])
    set_status(
        machine,
        MachineStatus.KEY_MISMATCH,
        f"The machine now presents {presented.fingerprint}, not the pinned "
        f"{machine.host_key_fingerprint}; no command runs until a key is pinned again.",
    )


def flag_key_mismatch_handler(machine_id: int, presented: ssh.RemoteHostKey) -> None:
    """The pool's hook: flagging must never hide the HostKeyMismatch the caller gets."""
    try:
        machine_flag_key_mismatch(machine_id=machine_id, presented=presented)
    except Exception:
        logger.exception("could not flag machine %s after a host key mismatch", machine_id)


# --- Removal --------------------------------------------------------------------------------


def machine_remove(*, machine_id: int) -> None:
    """Remove a machine that has never been rented (rentals keep their history, so a machine
    with any on record can only be unlisted). Its pooled connection is closed after commit."""
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=machine_id)
        try:
            with transaction.atomic():
                machine.delete()
        except ProtectedError:
            raise ValidationError(
                {"machine": "It has rentals on record, so it stays; unlist it instead."}
            ) from None
        transaction.on_commit(lambda: ssh.pool.forget(machine_id))
