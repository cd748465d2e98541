"""Schemathesis over the API's own OpenAPI schema, in-process: for any input it generates,
valid or deliberately invalid, no endpoint answers 5xx, and every error has the API's shape.

The server is configured as a real one is, card payments included (Stripe's stand-in, in its
real format): a valid top-up then really opens a checkout instead of answering 503 "not
configured", which is the server's setup and not the request's fault.

Bounded to a few hundred examples over all operations (well under a minute); the schema-driven
cases in test_api_number_inputs.py cover the number fields one by one.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
import schemathesis
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.core import NOT_SET
from schemathesis.generation import GenerationMode

from tests.conftest import examples
from tests.marketplace.test_api_number_inputs import (  # noqa: F401 (fixtures)
    api_schema,
    console_api,
    world,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def payments(settings):
    """Card payments configured, against Stripe's stand-in."""
    from tests.billing.stripe_fakes import WEBHOOK_SECRET, FakeStripeApi

    with FakeStripeApi() as stripe_api:
        settings.STRIPE_SECRET_KEY = "sk_test_local"
        settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
        settings.STRIPE_API_BASE = stripe_api.base_url
        yield stripe_api


SCHEMA = schemathesis.openapi.from_dict(api_schema())


def any_case(world) -> st.SearchStrategy:  # noqa: F811 (the fixture's value)
    """Valid and invalid requests to every operation; half of them name the world's real
    objects in their paths (a machine, an instance), so they get past the 404 to validation."""
    real = {"machine_id": world["for_rent"].pk, "month": f"{timezone.now():%Y-%m}"}
    strategies = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        strategies.append(SCHEMA.as_strategy(generation_mode=mode))
        for own in (world["own"].pk, world["instance_id"]):
            ids = {**real, "id": own}
            strategies.append(SCHEMA.as_strategy(generation_mode=mode, path_parameters=ids))
    return st.one_of(strategies)


def send(api, case):
    """The generated request, as the test client sends it (bodies that are not JSON go as
    they are, under the generated media type)."""
    path = case.formatted_path
    if case.query:
        path += "?" + urlencode(case.query, doseq=True)
    body, media_type = case.body, case.media_type or "application/json"
    if body is NOT_SET or body is None:
        return api.generic(case.method.upper(), path)
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    return api.generic(case.method.upper(), path, body, content_type=media_type)


@settings(
    max_examples=examples(300),
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure here is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_generated_request_answers_a_server_error(world, console_api, payments, data):  # noqa: F811
    if "cases" not in world:  # one strategy for all examples of this run
        world["cases"] = any_case(world)
    case = data.draw(world["cases"])
    response = send(console_api, case)
    assert response.status_code < 500, (case.method, case.formatted_path, case.query, case.body)
    if response.status_code >= 400 and response["Content-Type"].startswith("application/json"):
        assert set(response.json()) == {"error"}, response.content
