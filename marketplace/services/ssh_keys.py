"""A team's SSH keys: validated OpenSSH public keys, put into every container the team launches."""

from __future__ import annotations

import base64
import hashlib

from django.core.exceptions import ValidationError
from django.db import transaction

from hosts.user_text import name_check
from marketplace.models import SshKey, Team

SSH_KEY_TYPES = {
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
}


def ssh_key_fingerprint(public_key: str) -> str:
    """Validate an OpenSSH public key line and return its SHA256 fingerprint."""
    parts = public_key.strip().split()
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES or "\n" in public_key.strip():
        raise ValidationError(
            {"public_key": "Paste one OpenSSH public key line, like 'ssh-ed25519 AAAA… you@host'."}
        )
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise ValidationError({"public_key": "The key's base64 part is damaged."}) from None
    if not blob.startswith(len(parts[0]).to_bytes(4, "big") + parts[0].encode()):
        raise ValidationError({"public_key": "The key's type does not match its contents."})
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


@transaction.atomic
def ssh_key_add(*, team: Team, name: str, public_key: str) -> SshKey:
    name = name.strip()
    if not name:
        raise ValidationError({"name": "Give the key a name."})
    name_check(name, "name", max_length=80)
    fingerprint = ssh_key_fingerprint(public_key)
    if SshKey.objects.filter(team=team, fingerprint=fingerprint).exists():
        raise ValidationError({"public_key": "This key is already on the team."})
    clean = " ".join(public_key.strip().split()[:3])
    return SshKey.objects.create(
        team=team, name=name[:80], public_key=clean, fingerprint=fingerprint
    )


def team_ssh_public_keys(team_id: int) -> list[str]:
    return list(SshKey.objects.filter(team_id=team_id).values_list("public_key", flat=True))
