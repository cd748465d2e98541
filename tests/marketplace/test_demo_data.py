"""``demo_data`` makes users with passwords printed in the README; it must never run against a
real (DEBUG off) database, and it still works for ``make run`` (DEBUG on)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from marketplace.models import User

pytestmark = pytest.mark.django_db


def test_demo_data_refuses_to_run_without_debug(settings):
    settings.DEBUG = False

    with pytest.raises(CommandError) as refused:
        call_command("demo_data")

    message = str(refused.value)
    assert "DEBUG" in message  # why
    assert "createsuperuser" in message  # what to do instead
    assert not User.objects.filter(username__in=["admin", "renter", "provider"]).exists()


def test_demo_data_makes_the_demo_users_with_debug(settings):
    settings.DEBUG = True

    call_command("demo_data")

    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("admin-demo-pass")
    assert User.objects.get(username="renter").check_password("renter-demo-pass")
