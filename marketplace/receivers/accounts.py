"""Every user gets a personal team the moment the account exists, whichever door made it:
sign-up, ``createsuperuser``, the admin's add-user form, a script calling ``create_user``."""

from __future__ import annotations

from django.db.models.signals import post_save
from django.dispatch import receiver

from marketplace.models import User
from marketplace.services.tenancy import personal_team_ensure


@receiver(post_save, sender=User, dispatch_uid="marketplace.user_personal_team")
def user_created(sender, instance: User, created: bool, raw: bool = False, **kwargs) -> None:
    if created and not raw:  # fixtures (raw) bring their own teams
        personal_team_ensure(user=instance)
