"""A team's environment variables: secrets (tokens, passwords) every new instance of the team
gets in its environment. Kept sealed (marketplace/secrets_box.py) and never shown back."""

from __future__ import annotations

from django.db import models


class TeamEnvVar(models.Model):
    team = models.ForeignKey("marketplace.Team", on_delete=models.CASCADE, related_name="env_vars")
    name = models.CharField(max_length=128)
    sealed_value = models.TextField(help_text="secrets_box.seal of the value")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="team_env_var_unique_name")
        ]

    def __str__(self) -> str:
        return self.name
