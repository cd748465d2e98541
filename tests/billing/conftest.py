from __future__ import annotations

import pytest

from tests.factories import TeamFactory


@pytest.fixture
def renter_team(db):
    return TeamFactory(name="Renter Co")


@pytest.fixture
def provider_team(db):
    return TeamFactory(name="Provider Co")
