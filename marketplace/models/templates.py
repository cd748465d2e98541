"""A team's saved launch settings: what to run and how (image, launch mode, env, ports, the
entrypoint and its arguments, disk) with a readme, kept to rent from again. A public template
may be rented from by any team; its owner alone changes it."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models

from scheduler.models import LaunchMode


def new_hash_id() -> str:
    return secrets.token_hex(16)


class Template(models.Model):
    team = models.ForeignKey("marketplace.Team", on_delete=models.CASCADE, related_name="templates")
    hash_id = models.CharField(
        max_length=32, unique=True, default=new_hash_id, help_text="names it for renting"
    )
    name = models.CharField(max_length=80)
    description = models.CharField(max_length=300, blank=True)
    readme = models.TextField(blank=True)
    public = models.BooleanField(default=False, help_text="any team may rent from it")
    image = models.CharField(max_length=255)
    launch_mode = models.CharField(
        max_length=16, choices=LaunchMode.choices, default=LaunchMode.ENTRYPOINT
    )
    entrypoint = models.CharField(max_length=255, blank=True)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    ports = models.JSONField(default=list, blank=True)
    disk_gb = models.PositiveIntegerField(default=10)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "pk"]
        indexes = [models.Index(fields=["public", "name"], name="template_public_name")]

    def __str__(self) -> str:
        return self.name
