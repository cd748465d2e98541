from __future__ import annotations

import pytest

from tests.factories import TeamFactory


@pytest.fixture
def renter_team(db):
    return TeamFactory(name="Renter Co")


@pytest.fixture
def provider_team(db):
    return TeamFactory(name="Provider Co")


@pytest.fixture
def stripe_settings(settings):
    from tests.billing.stripe_fakes import WEBHOOK_SECRET

    settings.STRIPE_SECRET_KEY = "sk_test_local"
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    return settings


@pytest.fixture
def fake_stripe(stripe_settings):
    from tests.billing.stripe_fakes import FakeStripeApi

    with FakeStripeApi() as api:
        stripe_settings.STRIPE_API_BASE = api.base_url
        yield api


@pytest.fixture
def rent(renter_team, provider_team):
    """Make a rental on one machine the way renting does (an instance in ``state``, a hold
    for ``hold`` micro-dollars funded by a grant of exactly that, the rental), with clocks
    set by the caller. ``rent.now`` is the time the rentals are made around."""
    from datetime import timedelta

    from django.utils import timezone

    from billing.credits import credit_grant
    from billing.holds import hold_create
    from hosts.models import Machine
    from marketplace.models import Rental
    from scheduler.models import Instance

    machine = Machine.objects.create(
        team=provider_team, name="m1", address="127.0.0.1", status="online", listed=True,
        price_per_gpu_hour=600_000, storage_price_per_gb_month=150_000,
    )  # fmt: skip
    now = timezone.now()

    def make(
        *, gpus=1, disk=20, hold=100_000_000, state="running", ends_in=timedelta(hours=24),
        **clocks,
    ) -> Rental:  # fmt: skip
        instance = Instance.objects.create(
            team=renter_team, machine=machine, gpu_count=gpus, image="busybox", disk_gb=disk,
            state=state,
        )  # fmt: skip
        credit_grant(
            team_id=renter_team.pk, amount=hold, reason="t", idempotency_key=f"i{instance.pk}"
        )
        held = hold_create(
            team_id=renter_team.pk, provider_team_id=provider_team.pk, amount=hold,
            reference=f"rental:{instance.pk}", idempotency_key=f"hold-{instance.pk}",
            machine_reference=f"machine:{machine.pk}",
        )  # fmt: skip
        return Rental.objects.create(
            team=renter_team, provider_team=provider_team, machine=machine, instance=instance,
            gpu_count=gpus, price_per_gpu_hour=machine.price_per_gpu_hour,
            storage_price_per_gb_month=machine.storage_price_per_gb_month, disk_gb=disk,
            starts_at=now - timedelta(hours=3), ends_at=now + ends_in, hold_id=held.pk, **clocks,
        )  # fmt: skip

    make.now = now
    make.machine = machine
    return make
