"""Accounts: users, teams, members with roles, invitations and API keys.

Everything a user can reach belongs to a team; ``marketplace.tenancy`` is the one gateway that
turns a request into the queries it may see.
"""

from __future__ import annotations

import hashlib

from django.contrib.auth.models import AbstractUser
from django.db import models
from django.utils import timezone


class User(AbstractUser):
    email = models.EmailField(unique=True)


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


# What each role may do; higher roles include the lower ones.
ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


def role_covers(role: str, needed: str) -> bool:
    return ROLE_RANK[Role(role)] >= ROLE_RANK[Role(needed)]


def lesser_role(first: str, second: str) -> Role:
    return min(Role(first), Role(second), key=lambda role: ROLE_RANK[role])


class Team(models.Model):
    name = models.CharField(max_length=80)
    personal = models.BooleanField(
        default=False, help_text="Created with the user; cannot be left or deleted."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(User, through="Membership", related_name="teams")

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"

    def allows(self, needed: Role) -> bool:
        return role_covers(self.role, needed)


class Invitation(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(User, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.email} to {self.team}"

    @property
    def is_open(self) -> bool:
        return (
            self.accepted_at is None
            and self.revoked_at is None
            and self.expires_at > timezone.now()
        )

    @property
    def is_expired(self) -> bool:
        return self.accepted_at is None and self.expires_at <= timezone.now()

    @property
    def status(self) -> str:
        """What the team page shows: open, expired, accepted or revoked."""
        if self.accepted_at is not None:
            return "accepted"
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.is_expired else "open"


class ApiKey(models.Model):
    """A team's API key. Only a SHA-256 of the secret is stored; the prefix finds the row.

    The full key is ``gpk_<prefix>_<secret>`` and is shown once, at creation. A key acts with
    the lesser of its access (read → viewer, write → its creator's role) and its creator's
    *current* role in the team, so demoting someone demotes their keys, and a key whose creator
    left the team stops working (``acting_role`` is None).
    """

    class Access(models.TextChoices):
        READ = "read", "Read only"
        WRITE = "write", "Read and write"

    class Audience(models.TextChoices):
        RENTER = "renter", "Renter"
        PROVIDER = "provider", "Host provider"
        ALL = "all", "Renter and host provider"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=12, unique=True)
    key_hash = models.CharField(max_length=64)
    access = models.CharField(max_length=8, choices=Access.choices, default=Access.READ)
    audience = models.CharField(max_length=8, choices=Audience.choices, default=Audience.RENTER)
    created_by = models.ForeignKey(User, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"

    @staticmethod
    def hash_secret(secret: str) -> str:
        return hashlib.sha256(secret.encode()).hexdigest()

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()

    def allows_audience(self, audience: str) -> bool:
        return self.audience in (ApiKey.Audience.ALL, audience)

    @property
    def current_role(self) -> Role | None:
        """``acting_role`` from the ``creator_role`` annotation (``api_keys_with_creator_role``)."""
        return self.acting_role(getattr(self, "creator_role", None))

    def acting_role(self, creator_role: str | None) -> Role | None:
        """The role this key acts with, given its creator's current role in the team."""
        if creator_role is None:
            return None
        cap = Role.OWNER if self.access == ApiKey.Access.WRITE else Role.VIEWER
        return lesser_role(cap, creator_role)
