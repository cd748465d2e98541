"""Schemathesis over the vast.ai-compatible API's own schema (/api/v0/schema/), in-process, as
test_api_fuzz.py does for /api/v1/: for any request it generates, valid or deliberately
invalid, no endpoint answers 5xx, and every error has vast's shape (``success``, ``msg``) with
our ``error`` object beside it.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.core import NOT_SET
from schemathesis.generation import GenerationMode

from tests.conftest import examples, key_client
from tests.marketplace.test_api_number_inputs import world  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

V0 = "/api/v0"


def any_case(schema, world) -> st.SearchStrategy:  # noqa: F811 (the fixture's value)
    """Valid and invalid requests to every operation; some name the world's real objects in
    their paths (an offer, an instance), so they get past the 404 to the body's checks."""
    strategies = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        strategies.append(schema.as_strategy(generation_mode=mode))
        real = {"offer_id": world["for_rent"].pk, "pk": world["instance_id"]}
        strategies.append(schema.as_strategy(generation_mode=mode, path_parameters=real))
    return st.one_of(strategies)


def send(api, case):
    path = V0 + case.formatted_path
    if case.query:
        path += "?" + urlencode(case.query, doseq=True)
    body, media_type = case.body, case.media_type or "application/json"
    if body is NOT_SET or body is None:
        return api.generic(case.method.upper(), path)
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    return api.generic(case.method.upper(), path, body, content_type=media_type)


@settings(
    max_examples=examples(150),
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure here is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_generated_v0_request_answers_a_server_error(world, team, data):  # noqa: F811
    if "v0" not in world:  # one client and one strategy for all examples of this run
        api = key_client(team)
        raw = api.get(f"{V0}/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
        raw["paths"].pop("/schema/", None)
        world["v0"] = (api, any_case(schemathesis.openapi.from_dict(raw), world))
    api, cases = world["v0"]
    case = data.draw(cases)
    response = send(api, case)
    assert response.status_code < 500, (case.method, case.formatted_path, case.query, case.body)
    if response.status_code >= 400 and response["Content-Type"].startswith("application/json"):
        assert {"success", "msg", "error"} <= set(response.json()), response.content
