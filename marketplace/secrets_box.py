"""Encryption for secrets we must keep and use later (private-registry passwords).

Fernet (AES-128-CBC + HMAC-SHA256) with a key derived from SECRET_KEY, so a database dump
alone does not reveal them. Rotating SECRET_KEY makes stored secrets unreadable; renters then
enter them again.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    digest = hashlib.sha256(f"gpumkt-secrets:{settings.SECRET_KEY}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def unseal(token: str) -> str | None:
    """The secret, or None when it cannot be read (damaged, or SECRET_KEY rotated)."""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except (InvalidToken, ValueError):
        return None
