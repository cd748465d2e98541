"""Money as people read it: balances, holds, costs and ledger rows to the cent on every page;
prices per hour exact (usage is charged per second at them); the API and the CSV export keep
the exact micro-dollars. Before, the balance read "$99.532082" and a one-micro-dollar charge
"-$0.000001"."""

from __future__ import annotations

import re

import pytest

from billing.credits import credit_grant
from billing.holds import hold_capture_usage, hold_create
from billing.usd import format_amount, format_usd
from tests.conftest import client_for, key_client
from tests.factories import TeamFactory

pytestmark = pytest.mark.django_db

USD = 1_000_000


@pytest.mark.parametrize(
    ("micro", "text"),
    [
        (0, "$0.00"),
        (499_532_082, "$499.53"),
        (4_995_000, "$5.00"),  # half a cent rounds up
        (4_994_999, "$4.99"),
        (1_234_567_890_000, "$1,234,567.89"),
        (1, "<$0.01"),
        (-1, "−<$0.01"),
        (-2_500_000, "−$2.50"),
    ],
)
def test_an_amount_reads_to_the_cent_and_a_sub_cent_one_never_looks_free(micro, text):
    assert format_amount(micro) == text


def test_a_rate_stays_exact():
    assert format_usd(125) == "$0.000125" and format_usd(850_000) == "$0.85"


@pytest.fixture
def odd_books(team, owner):
    """Credit with micro-dollars in it, and a charge of one micro-dollar."""
    provider = TeamFactory(name="Host Co")
    credit_grant(team_id=team.id, amount=100 * USD, reason="Welcome", idempotency_key="w")
    hold = hold_create(
        team_id=team.id, provider_team_id=provider.id, amount=467_918, reference="rental:1",
        idempotency_key="h", machine_reference="machine:1", description="RTX 4090 x1",
    )  # fmt: skip
    hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=1)
    return hold


def test_pages_show_cents_and_the_api_and_export_stay_exact(client, owner, team, odd_books):
    page = client_for(client, owner, team).get("/billing/").content.decode()
    # 100 − 0.467918 held = 99.532082 available; 0.467917 still held.
    assert 'id="balance-available">$99.53<' in page
    assert 'id="balance-held">$0.47<' in page
    assert "−&lt;$0.01" in page  # the one-micro-dollar charge, not "$0.000001"
    assert not re.search(r"\$\d+\.\d{3,}", page), re.findall(r"\$\d+\.\d{3,}", page)
    overview = client.get("/").content.decode()
    assert 'id="overview-available">$99.53<' in overview

    api = key_client(team).get("/api/v1/billing/balance/")
    assert api.status_code == 200, api.content
    assert "99.532082" in api.content.decode()
    export = client.get("/billing/ledger.csv").getvalue().decode()
    assert "-0.000001" in export
