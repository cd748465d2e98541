"""Renting fixtures for scheduler tests on simulated hosts: the same ones tests/marketplace uses
(a provider's listed machine, a funded renter team, test containers labelled and removed)."""

from tests.marketplace.conftest import (  # noqa: F401 (fixtures, found by pytest by name)
    _label_test_containers,
    funded_team,
    provider_team,
)
