"""The platform's own SSH key pair, which providers add to ``authorized_keys``.

Kept at ``settings.PLATFORM_SSH_KEY_PATH`` (OpenSSH private key) with ``.pub`` beside it;
made on first use.
"""

from __future__ import annotations

from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings


def ensure_platform_key(path: Path | None = None) -> Path:
    path = Path(path or settings.PLATFORM_SSH_KEY_PATH)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pem)
    tmp.chmod(0o600)
    path.with_suffix(".pub").write_text(public.decode() + " gpu-marketplace\n")
    tmp.replace(path)  # atomic, so two processes never read half a key
    return path


def platform_private_key() -> paramiko.PKey:
    return paramiko.Ed25519Key.from_private_key_file(str(ensure_platform_key()))


def platform_public_key() -> str:
    return ensure_platform_key().with_suffix(".pub").read_text().strip()
