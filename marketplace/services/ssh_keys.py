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


def ssh_key_replace(*, key: SshKey, public_key: str) -> SshKey:
    """A new public key under the same name (instances launched from now get it; running ones
    keep the keys they were given)."""
    fingerprint = ssh_key_fingerprint(public_key)
    taken = SshKey.objects.filter(team_id=key.team_id, fingerprint=fingerprint)
    if taken.exclude(pk=key.pk).exists():
        raise ValidationError({"public_key": "This key is already on the team."})
    key.public_key, key.fingerprint = " ".join(public_key.strip().split()[:3]), fingerprint
    key.save(update_fields=["public_key", "fingerprint"])
    return key


def team_ssh_public_keys(team_id: int) -> list[str]:
    return list(SshKey.objects.filter(team_id=team_id).values_list("public_key", flat=True))


# --- keys on a running instance ---------------------------------------------------------------

# Run in the container with the key line as "$1" (an argument, never pasted into the script).
# The awk programs compare a line's first two fields (type and base64) with the key's.
_ATTACH = (
    "mkdir -p /root/.ssh && chmod 700 /root/.ssh && f=/root/.ssh/authorized_keys && "
    'touch "$f" && chmod 600 "$f" && '
    'if awk -v k="$1" \'$1" "$2 == k { found = 1 } END { exit !found }\' "$f"; then :; '
    'else printf "%s\\n" "$1" >> "$f"; fi'
)
_DETACH = (
    'f=/root/.ssh/authorized_keys; [ -f "$f" ] || exit 0; '
    'awk -v k="$1" \'$1" "$2 != k\' "$f" > "$f.gpumkt" && '
    'cat "$f.gpumkt" > "$f" && rm -f "$f.gpumkt"'
)
KEY_EXEC_TIMEOUT = 15.0


class InstanceKeysUnavailable(Exception):
    http_status = 409
    error_code = "invalid_state"


def _key_line(public_key: str) -> str:
    """The key's type and base64, as authorized_keys matches it (the comment is the user's)."""
    return " ".join(public_key.split()[:2])


def _takes_keys(instance) -> None:
    from scheduler.models import InstanceState, LaunchMode

    if instance.launch_mode != LaunchMode.SSH:
        raise InstanceKeysUnavailable(
            "Only SSH-mode instances take SSH keys (their sshd reads /root/.ssh/authorized_keys)."
        )
    if instance.state != InstanceState.RUNNING:
        raise InstanceKeysUnavailable("SSH keys are put into a running instance only.")


def _in_container(instance, script: str, line: str) -> None:
    from core.db import release_database_connection
    from hosts.runtime import DockerHost

    _takes_keys(instance)
    host = DockerHost(instance.machine)
    release_database_connection()
    result = host.exec(
        instance.container_id, ["sh", "-c", script, "sh", line], timeout=KEY_EXEC_TIMEOUT
    )
    if result.exit_code != 0:
        raise InstanceKeysUnavailable(
            f"The instance's container refused the change: {(result.stderr or result.stdout)[-300:]}"
        )


def instance_ssh_key_attach(*, instance, public_key: str, name: str) -> SshKey:
    """Put a key into a running SSH-mode instance's authorized_keys now (the team keeps it
    too, so it goes into the team's later launches). Once, however often it is attached."""
    _takes_keys(instance)  # before the key is kept on the team
    fingerprint = ssh_key_fingerprint(public_key)
    key = SshKey.objects.filter(team_id=instance.team_id, fingerprint=fingerprint).first()
    if key is None:
        key = ssh_key_add(team=instance.team, name=name, public_key=public_key)
    _in_container(instance, _ATTACH, _key_line(key.public_key))
    return key


def instance_ssh_key_detach(*, instance, key: SshKey) -> None:
    """Take the team's key out of a running SSH-mode instance (the team keeps the key)."""
    _in_container(instance, _DETACH, _key_line(key.public_key))
