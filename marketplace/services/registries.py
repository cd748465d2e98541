"""Private registries: which registries a rental may pull from, and the renter's registry
login, sealed at rest and opened only for the launch."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from hosts.runtime import InvalidContainerSpec, check_registry
from marketplace.secrets_box import seal, unseal
from scheduler.models import Instance


def registry_check(*, image: str, allow_private: bool) -> None:
    """Refuse an image from a registry on the machine's own network unless its provider allows
    one (``allow_private``: hosts.runtime.registry_refusal). Before any lock is taken: a name
    lookup may be slow."""
    try:
        check_registry(image, allow_private=allow_private)
    except InvalidContainerSpec as error:
        raise ValidationError({error.field: error.reason}) from error


def registry_login_seal(*, username: str, password: str) -> dict[str, str]:
    """A private registry login, the password encrypted at rest; {} for public images."""
    if not username and not password:
        return {}
    if not username or not password:
        raise ValidationError(
            {"registry_username": "Give both the registry user name and password, or neither."}
        )
    return {"username": username, "password": seal(password)}


class RegistryLoginUnreadable(Exception):
    """The rental's registry password was sealed under a secret key the platform no longer has."""


def registry_credentials(instance: Instance) -> tuple[str, str] | None:
    """The decrypted login for the instance's private registry, if it has one.

    A login that can no longer be opened raises RegistryLoginUnreadable: pulling without it
    would fail as a bare 'unauthorized' that tells the renter nothing.
    """
    stored = instance.registry_credential or {}
    if not stored.get("username"):
        return None
    password = unseal(stored.get("password", ""))
    if password is None:
        raise RegistryLoginUnreadable(
            "the registry password can no longer be read (the platform's secret key changed "
            "since it was given); rent again with the registry login"
        )
    return stored["username"], password
