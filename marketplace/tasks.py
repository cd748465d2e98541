from __future__ import annotations

from celery import shared_task

from marketplace.services.tenancy import invitations_expire as expire


@shared_task(name="marketplace.tasks.invitations_expire")
def invitations_expire() -> int:
    return expire()
