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


LABEL_MAX = 100


def label_check(label: str) -> None:
    """An instance's label is the renter's own text, shown back to them: at most LABEL_MAX
    printable characters (no line breaks or control characters to garble a list)."""
    if len(label) > LABEL_MAX:
        raise ValidationError({"label": f"At most {LABEL_MAX} characters."})
    if not label.isprintable():
        raise ValidationError({"label": "Printable characters only (no line breaks or tabs)."})
