"""Checks on what a renter asks to run, at rent time, with errors that name the field.

hosts.runtime validates the final container spec again before any command is built; this
layer exists so a bad request fails with a 400 before anything is allocated or held.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError

from hosts.runtime import (
    PROGRAM_NAME,
    InvalidContainerSpec,
    validate_env,
    validate_image,
    validate_ports,
)
from hosts.user_text import name_check


def validate_launch(
    *, image: str, env: dict[str, str], ports: list[int], entrypoint: str, args: list[str]
) -> None:
    errors: dict[str, str] = {}
    checks = [
        ("image", lambda: validate_image(image)),
        ("env", lambda: validate_env(env)),
        ("ports", lambda: validate_ports([(p, p, "tcp") for p in ports])),
    ]
    for field, check in checks:
        try:
            check()
        except InvalidContainerSpec as error:
            errors[field] = error.reason
    if "image" not in errors and (problem := image_host_problem(image)) is not None:
        errors["image"] = problem
    for key in env:
        if key.upper().startswith("NVIDIA_"):
            errors["env"] = f"{key} is set by the platform from your GPU allocation."
        elif key.upper().startswith("CUDA_MPS_"):
            errors["env"] = f"{key} is set by the platform from your GPU slice (CUDA MPS limits)."
    if len(set(ports)) != len(ports):
        errors["ports"] = "Each container port may be listed once."
    if entrypoint and not PROGRAM_NAME.match(entrypoint):
        errors["entrypoint"] = "A program name or path (letters, digits, / . _ + -), not an option."
    if any("\0" in arg for arg in args):
        errors["args"] = "Arguments may not contain NUL characters."
    if errors:
        raise ValidationError(errors)


def image_host_problem(image: str) -> str | None:
    """What Docker makes of the part before the first '/': a registry's host when it has a
    '.' or ':' or is "localhost" (or, oddly, has capitals), else the start of a Docker Hub
    repository, which is lower-case. So "BUSYBOX/busybox" would be pulled from a host named
    BUSYBOX and fail at launch; it is refused here, before anything is held."""
    first, slash, _ = image.partition("/")
    if not slash or "." in first or ":" in first or first == "localhost":
        return None
    if first != first.lower():
        return (
            f"'{first[:60]}' is not a registry host (no '.' or ':'), and a repository name is "
            "lower-case; write it in lower case, or give the registry's full host name."
        )
    return None


# A registry login goes to `docker login` and into an Authorization header: a control character
# (a line break, an escape) would split or garble them, and ':' ends a Basic-auth user name.
def registry_login_check(*, username: str, password: str) -> None:
    errors: dict[str, str] = {}
    if not username.isprintable() or ":" in username or " " in username:
        errors["registry_username"] = "A user name of printable characters, without spaces or ':'."
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in password):
        errors["registry_password"] = "The password may not contain control characters."
    if errors:
        raise ValidationError(errors)


LABEL_MAX = 100


def label_check(label: str) -> None:
    """An instance's label is the renter's own text, shown back to them: at most LABEL_MAX
    printable characters, or none (hosts.user_text: the rule for every name a user types)."""
    name_check(label, "label", max_length=LABEL_MAX, required=False)
