"""A team's environment variables: secrets every new instance of the team gets in its
environment (its own env wins on a name both have). The values are sealed at rest
(marketplace/secrets_box.py) and never shown back: lists show names only."""

from __future__ import annotations

import logging

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from hosts.runtime import InvalidContainerSpec, validate_env
from marketplace import secrets_box
from marketplace.models import Team, TeamEnvVar

logger = logging.getLogger(__name__)

MAX_ENV_VARS = 100  # a launch takes at most 200 variables, the instance's own included
HIDDEN = "*****"  # what a list shows for every value


class EnvVarNotSet(Exception):
    http_status = 404
    error_code = "not_found"


def _check(name: str, value: str) -> None:
    if len(name) > 128:
        raise ValidationError({"name": "At most 128 characters."})
    for field, env in (("name", {name: ""}), ("value", {"VALUE": value})):
        try:
            validate_env(env)
        except InvalidContainerSpec as error:
            raise ValidationError(
                {field: error.reason.replace("VALUE's value", "The value")}
            ) from None
    if name.upper().startswith(("NVIDIA_", "CUDA_MPS_", "GPUMKT_")) or name == "JUPYTER_TOKEN":
        raise ValidationError({"name": f"{name} is set by the platform."})


def env_var_create(*, team: Team, name: str, value: str) -> TeamEnvVar:
    _check(name, value)
    if TeamEnvVar.objects.filter(team=team).count() >= MAX_ENV_VARS:
        raise ValidationError({"name": f"A team has at most {MAX_ENV_VARS} variables."})
    try:
        with transaction.atomic():
            return TeamEnvVar.objects.create(
                team=team, name=name, sealed_value=secrets_box.seal(value)
            )
    except IntegrityError:
        raise ValidationError({"name": f"{name} is set already; update it instead."}) from None


@transaction.atomic
def env_var_update(*, team: Team, name: str, value: str) -> TeamEnvVar:
    """A new value for the team's variable; instances launched before keep the old one."""
    _check(name, value)
    found = TeamEnvVar.objects.select_for_update().filter(team=team, name=name).first()
    if found is None:
        raise EnvVarNotSet(f"{name[:128]} is not set; create it first.")
    found.sealed_value = secrets_box.seal(value)
    found.save(update_fields=["sealed_value", "updated_at"])
    return found


def env_var_delete(*, team: Team, name: str) -> None:
    deleted, _ = TeamEnvVar.objects.filter(team=team, name=name).delete()
    if not deleted:
        raise EnvVarNotSet(f"{name[:128]} is not set.")


def team_launch_env(team_id: int) -> dict[str, str]:
    """The team's variables as a new instance gets them. One that cannot be unsealed (a
    SECRET_KEY rotated out) is left out, logged by name, and the team sets it again."""
    env = {}
    for name, sealed in TeamEnvVar.objects.filter(team_id=team_id).values_list(
        "name", "sealed_value"
    ):
        value = secrets_box.unseal(sealed)
        if value is None:
            logger.warning("team %s's variable %s cannot be read; left out", team_id, name)
            continue
        env[name] = value
    return env
