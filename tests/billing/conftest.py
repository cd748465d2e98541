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
