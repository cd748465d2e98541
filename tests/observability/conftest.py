"""Fixtures for observability tests: the renting fixtures (a listed machine on a simulated
host, a funded renter team) and a metrics scraper."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from prometheus_client.parser import text_string_to_metric_families

from marketplace.observability.ledger_check import CACHE_KEY
from tests.marketplace.conftest import (  # noqa: F401  (fixtures used here)
    _label_test_containers,
    funded_team,
    machine,
    provider_team,
)

METRICS_TOKEN = "scrape-token-for-tests-0123456789"


@pytest.fixture
def metrics_token(settings) -> str:
    settings.METRICS_TOKEN = METRICS_TOKEN
    return METRICS_TOKEN


@pytest.fixture(autouse=True)
def _fresh_ledger_check():
    """The ledger check is cached for a minute; each test reads its own database."""
    cache.delete(CACHE_KEY)
    yield
    cache.delete(CACHE_KEY)


class Scraped:
    """One scrape, parsed with prometheus_client's own parser."""

    def __init__(self, text: str):
        self.text = text
        self.samples = [
            sample for family in text_string_to_metric_families(text) for sample in family.samples
        ]

    def value(self, name: str, **labels: str) -> float | None:
        for sample in self.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
        return None


@pytest.fixture
def scrape(client, metrics_token):
    def scrape_now() -> Scraped:
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {metrics_token}")
        assert response.status_code == 200, response.content[:500]
        assert response["Content-Type"].startswith("text/plain")
        return Scraped(response.content.decode())

    return scrape_now
