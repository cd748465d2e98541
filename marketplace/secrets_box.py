"""Encryption for secrets we must keep and use later (private-registry passwords).

Fernet (AES-128-CBC + HMAC-SHA256) with a key derived from SECRET_KEY, so a database dump
alone does not reveal them. Keys are rotated the way Django rotates its own signatures: the new
key goes in SECRET_KEY and the old ones in SECRET_KEY_FALLBACKS; secrets are sealed with the
current key and opened with any of them. A secret sealed under a key no longer listed cannot be
read; ``unseal`` answers None and logs why, and the renter enters it again.
"""

from __future__ import annotations

import base64
import hashlib
import logging

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

logger = logging.getLogger(__name__)


def _fernet_for(secret_key: str) -> Fernet:
    digest = hashlib.sha256(f"gpumkt-secrets:{secret_key}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _keyring() -> MultiFernet:
    """The current key first (MultiFernet encrypts with the first), then the fallbacks."""
    secret_keys = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    return MultiFernet([_fernet_for(key) for key in secret_keys])


def seal(plaintext: str) -> str:
    return _keyring().encrypt(plaintext.encode()).decode()


def unseal(token: str) -> str | None:
    """The secret, or None when it cannot be read (damaged, or sealed under a SECRET_KEY that
    is neither the current one nor in SECRET_KEY_FALLBACKS)."""
    try:
        return _keyring().decrypt(token.encode()).decode()
    except (InvalidToken, ValueError):
        logger.warning(
            "A stored secret cannot be read: it is damaged, or was sealed under a SECRET_KEY "
            "that is no longer SECRET_KEY or in SECRET_KEY_FALLBACKS."
        )
        return None
