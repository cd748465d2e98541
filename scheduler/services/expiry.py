"""The end of a rental period: stop the container, end the instance on time."""

from __future__ import annotations

import logging

from django.utils import timezone

from hosts.runtime import CommandFailed, DockerHost, HostKeyMismatch, HostUnreachable
from scheduler.models import Instance, InstanceState
from scheduler.services.containers import container_gone_or_stopped, instance_container_ref
from scheduler.services.start import start_under_way
from scheduler.services.transitions import instance_transition

logger = logging.getLogger(__name__)


# States whose container may be running and is stopped when the rental period ends.
LIVE_STATES = (
    InstanceState.LAUNCHING,
    InstanceState.RUNNING,
    InstanceState.PAUSED,
    InstanceState.EXITED,
    InstanceState.UNKNOWN,
    InstanceState.STOPPING,
)


def _container_stopped(host: DockerHost, instance: Instance) -> tuple[bool, str]:
    """Stop the instance's container; (True, "") once it is known not to run.

    (False, why) when that cannot be known: the host did not answer, or answered with a
    changed key. An instance without a recorded container is stopped by its deterministic
    name, which also catches a container a launch made without recording it.
    """
    starting = Instance.objects.filter(pk=instance.pk).filter(start_under_way()).exists()
    if instance.state not in LIVE_STATES and not starting:
        return True, ""  # stopped already, its GPUs given back then
    try:
        container_gone_or_stopped(host, instance_container_ref(instance), remove=False)
    except CommandFailed as error:
        return False, f"docker stop failed: {error.stderr.strip()[:200]}"
    except (HostUnreachable, HostKeyMismatch) as error:
        return False, str(error)
    return True, ""


def _lease_valid(instance: Instance) -> bool:
    return instance.lease_expires_at is not None and instance.lease_expires_at > timezone.now()


def instance_expire(*, instance_id: int) -> Instance | None:
    """The rental's end: stop the container; data stays until the grace period ends.

    The rental ends on time whatever the host says (the renter is not charged past it). But
    its GPUs are given back only when the container is known to have stopped: with the host
    unreachable the container may still be running on them, so they stay reserved until
    ``machine_reconcile`` stops it and releases them.

    Returns None (and does nothing) for an instance that has ended already, or whose launch or
    stop a worker is carrying out right now: that finishes first, and the next expiry sweep
    ends what it left (so the container a launch is making is never left running).
    """
    instance = Instance.objects.select_related("machine").get(pk=instance_id)
    if instance.state in (
        InstanceState.EXPIRED,
        InstanceState.FAILED,
        InstanceState.DESTROYING,
        InstanceState.DESTROYED,
    ):
        return None
    if _lease_valid(instance):
        return None
    stopped, why = _container_stopped(DockerHost(instance.machine), instance)
    reason = "The rental period ended"
    if not stopped:
        logger.warning("could not stop expired instance %s: %s", instance_id, why)
        reason += (
            f"; the container could not be stopped yet ({why}), so its GPUs stay reserved "
            "until the host answers"
        )
    return instance_transition(
        instance_id=instance_id,
        to_state=InstanceState.EXPIRED,
        reason=reason,
        container_stopped=stopped,
        # Unknown too: a host found out of service while it was asked became unknown meanwhile.
        only_from={instance.state, InstanceState.UNKNOWN},
    )
