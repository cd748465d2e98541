"""Private images on a machine: which repositories a registry serves only to a login, learned
from the registry itself, so that one team's login never changes what another team may run.

Docker keeps a pulled image for anyone on the machine, so the local copy of a private image
proves nothing: a launch of a repository marked private here pulls again, with that rental's
own login (or none), and runs only if the registry lets it. A repository is marked only when
the registry proves it private: a pull with a login it accepted succeeded, and the same pull
without a login was refused. A login the registry refuses marks nothing (and fails only the
rental that gave it); a public image, whatever login came with it, stays usable by everyone.
"""

from __future__ import annotations

from collections.abc import Callable

from django.utils import timezone

from hosts.runtime import CommandFailed, DockerHost, image_repository
from scheduler.models import Instance, PrivateRepository


def repository_private(*, machine_id: int, repository: str) -> bool:
    """Whether a launch of ``repository`` on this machine must prove access with a pull
    before using the local copy: proven private, or a pull with a login under way."""
    return PrivateRepository.objects.filter(machine_id=machine_id, repository=repository).exists()


def pull_with_login(
    host: DockerHost,
    instance: Instance,
    credentials: tuple[str, str],
    progress: Callable[[int, str], None],
) -> None:
    """Pull the instance's image with the renter's login, and learn whether it is private.

    The login is asked about first: refused, the launch fails (RegistryLoginRefused) and
    nothing is recorded. Accepted, the repository is marked (unproven) before the pull, so a
    launch of another team that checks while this pull completes already finds it must prove
    access. After the pull, a pull without any login tells: refused, the mark is proven;
    served, the image is public and the mark goes. A failed pull takes its unproven mark away.
    """
    host.registry_login_check(instance.image, credentials)
    repository = image_repository(instance.image)
    mark, _ = PrivateRepository.objects.get_or_create(
        machine_id=instance.machine_id, repository=repository
    )
    try:
        host.pull(instance.image, progress_callback=progress, credentials=credentials)
    except CommandFailed:
        _unproven_mark_remove(instance.machine_id, repository)
        raise
    if mark.proven_at is not None:
        return
    try:
        host.pull(instance.image)  # the host's own Docker config: what a team without a login gets
    except CommandFailed:
        PrivateRepository.objects.update_or_create(
            machine_id=instance.machine_id,
            repository=repository,
            defaults={"proven_at": timezone.now()},
        )
        return
    _unproven_mark_remove(instance.machine_id, repository)


def _unproven_mark_remove(machine_id: int, repository: str) -> None:
    PrivateRepository.objects.filter(
        machine_id=machine_id, repository=repository, proven_at=None
    ).delete()
