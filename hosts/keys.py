"""The SSH keys the platform logs in to machines with: one key pair per provider team.

Each team's key is derived from the platform's secret key (``settings.PLATFORM_SSH_KEY_PATH``,
an OpenSSH private key made on first use), so every worker that has that one file can log in
for every team, and nothing per team is stored.

Why a key per team: with one key for every team, the platform could log in to any machine
that authorized it, for whichever team registered its address first, and that team would be
paid for someone else's GPUs. A machine that authorized team B's key refuses team A's, so a
team can only connect (and list) the machines whose owners let it in.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import io
import os
import secrets
from functools import lru_cache
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings


def ensure_platform_key(path: Path | None = None) -> Path:
    """The platform's secret key file, made on first use. Several processes may start at
    once: each writes its own candidate and only the first one linked into place counts."""
    path = Path(path or settings.PLATFORM_SSH_KEY_PATH)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    candidate = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        descriptor = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(pem)
        with contextlib.suppress(FileExistsError):
            os.link(candidate, path)  # never replaces a key another process put there
    finally:
        candidate.unlink(missing_ok=True)
    return path


def _platform_secret(path: Path) -> bytes:
    key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


@lru_cache(maxsize=1024)
def _team_key(secret_path: str, team_id: int) -> Ed25519PrivateKey:
    """Cached per secret file too: a test or a rotation that points elsewhere gets new keys."""
    seed = hmac.new(
        _platform_secret(Path(secret_path)), f"provider-team:{team_id}".encode(), hashlib.sha256
    ).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def _team_private_key(team_id: int) -> Ed25519PrivateKey:
    return _team_key(str(ensure_platform_key()), team_id)


def team_private_key(team_id: int) -> paramiko.PKey:
    """The key the platform logs in with to the team's machines."""
    pem = _team_private_key(team_id).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))


def team_public_key(team_id: int) -> str:
    """The ``authorized_keys`` line a provider team adds to its machines."""
    public = (
        _team_private_key(team_id)
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return f"{public.decode()} gpu-marketplace-team-{team_id}"


def fingerprint(key_blob: bytes) -> str:
    """``SHA256:…`` exactly as ``ssh-keygen -lf`` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key_blob).digest()).decode().rstrip("=")


def public_key_fingerprint(public_key: str) -> str:
    """The fingerprint of an ``authorized_keys`` line."""
    return fingerprint(base64.b64decode(public_key.split()[1]))
