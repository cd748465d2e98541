"""Demo data for ``make run``: an admin, a renter and a host provider (idempotent).

The demo users have published passwords (``admin``/``admin-demo-pass`` is a superuser), so the
command runs only with DEBUG on, as ``make run`` sets it: pointed at a real database by mistake
it would open that database to anyone who read the README.

Other rooms add their part through ``DEMO_DATA_STEPS`` (functions taking the demo users and the
simulated hosts' description), so this command never imports upward into their internals.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils.module_loading import import_string

from marketplace.models import Membership, Role, Team, User

DEMO_USERS = {
    "admin": ("admin-demo-pass", True),
    "renter": ("renter-demo-pass", False),
    "provider": ("provider-demo-pass", False),
}

# Dotted paths of functions ``step(users: dict[str, User], simhosts: list[dict]) -> str``.
DEMO_DATA_STEPS: list[str] = ["hosts.demo.demo_step", "billing.demo.demo_step"]


def demo_user(username: str, password: str, superuser: bool) -> User:
    user = User.objects.filter(username=username).first()
    if user is None:
        user = User.objects.create_user(
            username=username,
            email=f"{username}@demo.invalid",
            password=password,
            is_staff=superuser,
            is_superuser=superuser,
        )
    if not Membership.objects.filter(user=user, team__personal=True).exists():
        team = Team.objects.create(name=f"{username}'s team", personal=True)
        Membership.objects.create(team=team, user=user, role=Role.OWNER)
    return user


def refuse_outside_debug() -> None:
    if not settings.DEBUG:
        raise CommandError(
            "demo_data creates users with published passwords (a superuser 'admin' with "
            "password 'admin-demo-pass'), so it runs only with DEBUG on. Run it for a local "
            "demo with DEBUG=1 (as `make run` does); on a real database create accounts with "
            "`manage.py createsuperuser` instead."
        )


class Command(BaseCommand):
    help = "Create demo users (and, through DEMO_DATA_STEPS, machines and credit)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--simhosts", default="", help="hosts.json written by simhosts")

    def handle(self, *args, simhosts: str, **options) -> None:
        refuse_outside_debug()
        users = {name: demo_user(name, pw, su) for name, (pw, su) in DEMO_USERS.items()}
        hosts = json.loads(Path(simhosts).read_text()) if simhosts else []
        for step in DEMO_DATA_STEPS:
            message = import_string(step)(users, hosts)
            if message:
                self.stdout.write(message)
