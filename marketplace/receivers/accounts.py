"""Every user gets a personal team the moment the account exists, whichever door made it:
sign-up, ``createsuperuser``, the admin's add-user form, a script calling ``create_user``.
And a user who loses a membership or the account, by whatever door (the console, the admin,
a deleted team or user), is closed out of the live sockets serving it."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from marketplace.events import publish_access_lost
from marketplace.models import Membership, User
from marketplace.services.accounts import personal_team_ensure


@receiver(post_save, sender=User, dispatch_uid="marketplace.user_personal_team")
def user_created(sender, instance: User, created: bool, raw: bool = False, **kwargs) -> None:
    if created and not raw:  # fixtures (raw) bring their own teams
        personal_team_ensure(user=instance)


@receiver(post_save, sender=User, dispatch_uid="marketplace.user_deactivated")
def user_deactivated(sender, instance: User, created: bool, **kwargs) -> None:
    if not created and not instance.is_active:
        publish_access_lost(instance.pk, None)


@receiver(post_delete, sender=Membership, dispatch_uid="marketplace.membership_gone")
def membership_gone(sender, instance: Membership, **kwargs) -> None:
    publish_access_lost(instance.user_id, instance.team_id)
