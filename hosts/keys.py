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
import hashlib
import hmac
import io
from functools import lru_cache
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


@lru_cache(maxsize=4)
def _platform_secret(path: str) -> bytes:
    key = serialization.load_ssh_private_key(Path(path).read_bytes(), password=None)
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def _team_private_key(team_id: int) -> Ed25519PrivateKey:
    secret = _platform_secret(str(ensure_platform_key()))
    seed = hmac.new(secret, f"provider-team:{team_id}".encode(), hashlib.sha256).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


@lru_cache(maxsize=1024)
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


def public_key_fingerprint(public_key: str) -> str:
    """``SHA256:…`` of an ``authorized_keys`` line, as ``ssh-keygen -lf`` prints it."""
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
