"""Fixtures of the vast.ai facade's tests: the renting world shared with tests/marketplace,
and (for the conformance test) the live server and worker of the browser tests."""

from __future__ import annotations

from tests.browser.conftest import celery_worker, live_server_url  # noqa: F401
from tests.marketplace.conftest import (  # noqa: F401
    _label_test_containers,
    funded_team,
    machine,
    provider_team,
)
