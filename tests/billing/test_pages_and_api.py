"""Console pages and the REST API, with owner, teammate and outsider (tenancy), on PostgreSQL."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pypdf
import pytest
from django.utils import timezone

from billing.credits import credit_grant
from billing.holds import hold_capture_usage, hold_create, hold_release
from billing.metering import holds_settle_usage
from billing.models import Entry, Hold, TopUp, Transfer
from billing.selectors import team_balance
from billing.topups import stripe_event_process
from marketplace.models import ApiKey
from tests.billing.ledger_checks import ledger_counts
from tests.conftest import client_for, key_client
from tests.factories import TeamFactory

pytestmark = pytest.mark.django_db

USD = 1_000_000


@pytest.fixture
def books(team, owner, teammate):
    """The team rents from a provider (two machines) and is charged GPU time and storage."""
    provider = TeamFactory(name="Host Co")
    credit_grant(team_id=team.id, amount=100 * USD, reason="Welcome", idempotency_key="w")
    holds = []
    for n, machine in ((1, "machine:7"), (2, "machine:8")):
        hold = hold_create(
            team_id=team.id, provider_team_id=provider.id, amount=20 * USD,
            reference=f"rental:{n}", idempotency_key=f"hold-{n}",
            machine_reference=machine, description=f"RTX 4090 x{n}",
        )  # fmt: skip
        hold_capture_usage(hold_id=hold.pk, kind="gpu", owed_total=3 * USD * n)
        hold_capture_usage(hold_id=hold.pk, kind="storage", owed_total=USD // 4)
        holds.append(hold)
    hold_release(hold_id=holds[1].pk)
    return {"provider": provider, "holds": holds}


def test_balance_page_shows_balance_chart_holds_and_ledger(client, owner, team, books):
    response = client_for(client, owner, team).get("/billing/")
    assert response.status_code == 200
    html = response.content.decode()
    balance = team_balance(team.id)
    assert f"${balance.available // USD}." in html and "<svg" in html
    assert "rental:1" in html and "Usage charge" in html and "Hold released" in html
    assert 'id="ledger"' in html


def test_ledger_filters_by_kind_reference_and_date(client, owner, team, books):
    c = client_for(client, owner, team)
    html = c.get("/billing/", {"kind": "release"}).content.decode()
    assert "Hold released" in html and "Usage charge</td>" not in html
    html = c.get("/billing/", {"reference": "rental:2", "kind": "capture"}).content.decode()
    assert "rental:2" in html and "rental:1" not in html.split('id="ledger"')[1]
    tomorrow = (timezone.localdate() + timedelta(days=1)).isoformat()
    html = c.get("/billing/", {"start": tomorrow}).content.decode()
    assert "No ledger entries match these filters." in html
    bad = c.get("/billing/", {"start": tomorrow, "end": "2020-01-01"}).content.decode()
    assert "must not be after" in bad


def test_ledger_csv_export_respects_filters(client, owner, team, books):
    response = client_for(client, owner, team).get("/billing/ledger.csv", {"kind": "capture"})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows and {row["kind"] for row in rows} == {"capture"}
    assert len(rows) == Entry.objects.filter(team=team, transfer__kind="capture").count()
    assert {row["amount_usd"] for row in rows} >= {"-3.000000", "-6.000000"}


def test_csv_cells_cannot_become_spreadsheet_formulas(client, owner, team):
    credit_grant(team_id=team.id, amount=USD, reason='=HYPERLINK("x")', idempotency_key="f")
    body = b"".join(client_for(client, owner, team).get("/billing/ledger.csv").streaming_content)
    assert b"'=HYPERLINK" in body


def test_invoice_page_has_one_row_per_rental(client, owner, team, books):
    c = client_for(client, owner, team)
    month = timezone.localdate().strftime("%Y-%m")
    listing = c.get("/billing/invoices/").content.decode()
    assert f"/billing/invoices/{month}/" in listing
    html = c.get(f"/billing/invoices/{month}/").content.decode()
    assert html.count("<code>rental:1</code>") == 1 and html.count("<code>rental:2</code>") == 1
    assert "$9.50" in html  # 3 + 6 GPU + 2 × 0.25 storage
    assert "@media print" not in html and "no-print" in html
    assert c.get("/billing/invoices/1999-01/").status_code == 404
    assert c.get("/billing/invoices/garbage/").status_code == 404


def test_invoice_as_a_pdf_has_the_same_lines_and_total(client, owner, team, books):
    c = client_for(client, owner, team)
    month = timezone.localdate().strftime("%Y-%m")
    page = c.get(f"/billing/invoices/{month}/").content.decode()
    assert f'href="/billing/invoices/{month}/pdf/"' in page
    response = c.get(f"/billing/invoices/{month}/pdf/")
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    assert f'filename="invoice-{team.pk}-' in response["Content-Disposition"]
    pdf = pypdf.PdfReader(io.BytesIO(response.content))
    assert len(pdf.pages) == 1
    text = " ".join(page.extract_text() for page in pdf.pages)
    assert "Invoice" in text and team.name in text
    assert text.count("rental:1") == 1 and text.count("rental:2") == 1
    assert "$9.50" in text  # the total, as on the page
    assert "Team" not in text.split("Invoice")[0]  # none of the console's header or menus
    assert c.get("/billing/invoices/1999-01/pdf/").status_code == 404


def test_another_teams_invoice_pdf_is_404(client, outsider, books):
    month = timezone.localdate().strftime("%Y-%m")
    assert client_for(client, outsider).get(f"/billing/invoices/{month}/pdf/").status_code == 404


def test_empty_states(client, outsider):
    c = client_for(client, outsider)
    assert "No money has moved yet" in c.get("/billing/").content.decode()
    assert "No invoices yet" in c.get("/billing/invoices/").content.decode()
    assert "No earnings yet" in c.get("/earnings/").content.decode()


def test_earnings_page_shows_machines_days_and_the_fee(client, books, settings):
    provider = books["provider"]
    from tests.factories import UserFactory, add_member

    host = UserFactory(username="host")
    add_member(provider, host, "owner")
    html = client_for(client, host, provider).get("/earnings/").content.decode()
    assert "machine:7" in html and "machine:8" in html
    assert "Platform fee (10%)" in html
    assert "$9.50" in html and "$0.95" in html and "$8.55" in html  # gross, fee, net


def test_outsider_sees_none_of_the_teams_books(client, outsider, team, books):
    c = client_for(client, outsider)
    html = c.get("/billing/").content.decode()
    assert "rental:1" not in html and "No money has moved yet" in html
    assert "rental:" not in b"".join(c.get("/billing/ledger.csv").streaming_content).decode()
    month = timezone.localdate().strftime("%Y-%m")
    assert c.get(f"/billing/invoices/{month}/").status_code == 404
    topup = TopUp.objects.create(team=team, amount=10 * USD, checkout_session_id="cs_secret")
    assert (
        c.get("/billing/topup/return/", {"session_id": topup.checkout_session_id}).status_code
        == 404
    )


def test_teammate_sees_the_teams_books(client, teammate, team, books):
    html = client_for(client, teammate, team).get("/billing/").content.decode()
    assert "rental:1" in html


# --- top-ups through the console ---------------------------------------------------------------


def test_topup_form_redirects_to_stripe_checkout(client, owner, team, fake_stripe):
    response = client_for(client, owner, team).post("/billing/topup/", {"amount": "25.50"})
    assert response.status_code == 302
    assert response["Location"].startswith("https://checkout.stripe.com/")
    form = fake_stripe.requests[0]["form"]
    assert form["line_items[0][price_data][unit_amount]"] == "2550"
    assert (
        form["success_url"]
        == "http://testserver/billing/topup/return/?session_id={CHECKOUT_SESSION_ID}"
    )


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        ("1", "minimum"),
        ("20000", "maximum"),
        ("5.001", "cents"),
        ("-5", "negative"),
        ("NaN", "not an amount"),
    ],
)
def test_topup_form_refuses_bad_amounts_with_a_clear_error(
    client, owner, team, fake_stripe, amount, message
):
    response = client_for(client, owner, team).post(
        "/billing/topup/", {"amount": amount}, follow=True
    )
    assert message in response.content.decode()
    assert fake_stripe.requests == [] and not TopUp.objects.exists()


def test_topup_return_page_waits_then_shows_the_credit(client, owner, team):
    topup = TopUp.objects.create(team=team, amount=30 * USD, checkout_session_id="cs_ret")
    c = client_for(client, owner, team)
    html = c.get("/billing/topup/return/", {"session_id": "cs_ret"}).content.decode()
    assert "waiting for confirmation" in html and 'hx-trigger="every 2s"' in html
    stripe_event_process(
        payload={
            "id": "evt_ret", "type": "checkout.session.completed",
            "data": {"object": {
                "id": "cs_ret", "mode": "payment", "payment_status": "paid", "amount_total": 3000,
                "currency": "usd", "metadata": {"team_id": str(team.id), "topup_id": str(topup.pk)},
            }},
        }
    )  # fmt: skip
    partial = c.get("/billing/topup/return/", {"session_id": "cs_ret"}, HTTP_HX_REQUEST="true")
    html = partial.content.decode()
    assert "$30.00 added" in html and "hx-trigger" not in html and "<html" not in html


def test_without_stripe_the_page_says_so(client, owner, team, settings):
    settings.STRIPE_SECRET_KEY = ""
    html = client_for(client, owner, team).get("/billing/").content.decode()
    assert "Card payments are not configured" in html and "Pay with card" not in html


# --- the DEBUG test-credit button --------------------------------------------------------------


def test_test_credit_button_in_debug_without_stripe(client, owner, team, settings):
    settings.TEST_CREDIT_ENABLED = True
    c = client_for(client, owner, team)
    html = c.get("/billing/").content.decode()
    assert "test credit" in html and "DEBUG only" in html
    c.post("/billing/test-credit/", {"nonce": "n1"})
    c.post("/billing/test-credit/", {"nonce": "n1"})  # a double submit credits once
    assert team_balance(team.id).available == settings.BILLING_TEST_CREDIT_AMOUNT


def test_no_test_credit_when_disabled(client, owner, team, settings):
    settings.TEST_CREDIT_ENABLED = False
    c = client_for(client, owner, team)
    assert "test credit" not in c.get("/billing/").content.decode()
    before = ledger_counts()
    assert c.post("/billing/test-credit/", {"nonce": "n"}).status_code == 404
    assert ledger_counts() == before


def test_production_settings_have_no_test_credit():
    code = "from django.conf import settings; print(settings.TEST_CREDIT_ENABLED)"
    root = Path(__file__).resolve().parents[2]
    env = {"DEBUG": "0", "SECRET_KEY": "x" * 60, "DJANGO_SETTINGS_MODULE": "marketplace.settings",
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    for extra in ({}, {"DEBUG": "1", "STRIPE_SECRET_KEY": "sk_live_x"}):
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            env={**env, **extra},
            capture_output=True,
            text=True,
        )
        assert result.stdout.strip() == "False", result.stderr
    debug = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env={**env, "DEBUG": "1", "VAR_DIR": "/tmp/gpumkt-b4-var"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert debug.stdout.strip() == "True", debug.stderr


# --- the REST API ------------------------------------------------------------------------------


def test_api_balance_ledger_holds_invoices(team, owner, books):
    api = key_client(team)
    balance = api.get("/api/v1/billing/balance/").json()
    # Dollars as decimal strings: $100 granted, two $20 holds, $3.25 and $6.25 charged on
    # them, the second released (its $13.75 back).
    assert balance == {"available": "73.750000", "held": "16.750000", "earnings": "0.000000"}
    assert (team_balance(team.id).available, team_balance(team.id).held) == (73_750_000, 16_750_000)
    ledger = api.get("/api/v1/billing/ledger/", {"kind": "capture", "reference": "rental:1"}).json()
    assert ledger["count"] == 2 and {row["usage_kind"] for row in ledger["results"]} == {
        "gpu",
        "storage",
    }
    holds = api.get("/api/v1/billing/holds/", {"status": "open"}).json()
    assert [h["reference"] for h in holds["results"]] == ["rental:1"]
    month = timezone.localdate().strftime("%Y-%m")
    assert api.get("/api/v1/billing/invoices/").json() == [{"month": month, "total": "9.500000"}]
    invoice = api.get(f"/api/v1/billing/invoices/{month}/").json()
    assert len(invoice["lines"]) == 4 and invoice["total"] == "9.500000"


def test_ledger_time_filters_take_any_offset_and_name_a_time_off_the_calendar(team, books):
    api = key_client(team)
    # An offset PostgreSQL itself refuses (beyond ±15:59) is compared in UTC.
    far = api.get("/api/v1/billing/ledger/", {"created_before": "8329-03-13T08:33:10-21:39"})
    assert far.status_code == 200, far.content
    assert far.json()["count"] == api.get("/api/v1/billing/ledger/").json()["count"] > 0
    none_yet = api.get("/api/v1/billing/ledger/", {"created_before": "2000-01-01T00:00:00-21:39"})
    assert none_yet.status_code == 200 and none_yet.json()["count"] == 0
    # Before the year 1 in UTC: refused, naming the filter.
    off = api.get("/api/v1/billing/ledger/", {"created_after": "0001-01-01T00:30:00+05:00"})
    assert off.status_code == 400
    assert "created_after" in off.content.decode()


def test_api_outsider_gets_404_on_ids_and_empty_lists(team, owner, outsider, books):
    from marketplace.models import Membership

    own_team = Membership.objects.get(user=outsider).team
    api = key_client(own_team)
    hold = Hold.objects.filter(team=team).first()
    entry = Entry.objects.filter(team=team).first()
    assert api.get(f"/api/v1/billing/holds/{hold.pk}/").status_code == 404
    assert api.get(f"/api/v1/billing/ledger/{entry.pk}/").status_code == 404
    assert api.get("/api/v1/billing/holds/").json()["count"] == 0
    assert api.get("/api/v1/billing/ledger/").json()["count"] == 0
    assert api.get("/api/v1/billing/invoices/").json() == []
    month = timezone.localdate().strftime("%Y-%m")
    assert api.get(f"/api/v1/billing/invoices/{month}/").json()["error"]["code"] == "not_found"
    assert api.get("/api/v1/billing/balance/").json()["available"] == "0.000000"


def test_api_topup_create_and_errors(team, owner, fake_stripe):
    api = key_client(team)
    created = api.post(
        "/api/v1/billing/topups/",
        {
            "amount_usd": "12.00",
            "success_url": "https://a.example/s",
            "cancel_url": "https://a.example/c",
        },
        format="json",
    )
    assert created.status_code == 201
    assert created.json()["checkout_url"].startswith("https://checkout.stripe.com/")
    bad = api.post(
        "/api/v1/billing/topups/",
        {
            "amount_usd": "2",
            "success_url": "https://a.example/s",
            "cancel_url": "https://a.example/c",
        },
        format="json",
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["fields"]["amount_usd"][0].startswith("The minimum top-up is $5.00")
    read_only = key_client(team, access=ApiKey.Access.READ)
    assert read_only.post("/api/v1/billing/topups/", {}, format="json").status_code == 403
    assert TopUp.objects.count() == 1


def test_api_topup_without_stripe_is_503(team, owner, settings):
    settings.STRIPE_SECRET_KEY = ""
    response = key_client(team).post(
        "/api/v1/billing/topups/",
        {
            "amount_usd": "12.00",
            "success_url": "https://a.example/s",
            "cancel_url": "https://a.example/c",
        },
        format="json",
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "payments_unavailable"


def test_insufficient_credit_renders_as_402_in_the_api_format():
    from billing.errors import InsufficientCredit
    from marketplace.api.errors import api_exception_handler

    response = api_exception_handler(InsufficientCredit(needed=5 * USD, available=USD), {})
    assert response.status_code == 402
    assert response.data["error"]["code"] == "insufficient_credit"


def test_api_earnings_for_the_provider(books):
    from tests.factories import UserFactory, add_member

    provider = books["provider"]
    add_member(provider, UserFactory(username="host2"), "owner")
    body = key_client(provider).get("/api/v1/billing/earnings/").json()
    machines = {row["machine_reference"]: row for row in body["by_machine"]}
    assert machines["machine:8"] == {
        "machine_reference": "machine:8",
        "gross": "6.250000",
        "fee": "0.625000",
        "net": "5.625000",
    }
    assert len(body["by_day"]) == 1


# --- operators, demo ---------------------------------------------------------------------------


def test_admin_grants_credit_once_per_form(client, team, owner):
    from marketplace.models import User

    admin = User.objects.create_superuser("op", "op@example.com", "pw-for-tests-123")
    client.force_login(admin)
    form = client.get("/admin/billing/creditgrant/add/").content.decode()
    key = form.split('name="idempotency_key" value="')[1].split('"')[0]
    data = {"team": team.pk, "amount_usd": "50", "reason": "Support credit", "idempotency_key": key}
    assert client.post("/admin/billing/creditgrant/add/", data).status_code == 302
    assert client.post("/admin/billing/creditgrant/add/", data).status_code == 302
    assert team_balance(team.id).available == 50 * USD
    grant = Transfer.objects.get(kind="grant")
    assert grant.created_by_id == admin.pk and grant.description == "Support credit"
    bad = client.post(
        "/admin/billing/creditgrant/add/", {**data, "amount_usd": "-5", "idempotency_key": "k2"}
    )
    assert "must not be negative" in bad.content.decode()
    assert client.get("/admin/billing/transfer/").status_code == 200


def test_demo_step_grants_the_renter_500_once():
    from billing.demo import demo_step
    from tests.factories import UserFactory

    renter = UserFactory(username="renter")
    assert "$500.00" in demo_step({"renter": renter}, [])
    demo_step({"renter": renter}, [])
    team_id = renter.memberships.get(team__personal=True).team_id
    assert team_balance(team_id).available == 500 * USD


def test_balance_changes_are_pushed_to_the_team(team, django_capture_on_commit_callbacks):
    """Through the real channel layer: a socket of the team's group receives the new balance
    once the grant commits."""
    import asyncio

    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from marketplace.events import team_group

    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(team_group(team.id), channel)

    async def next_message():
        return await asyncio.wait_for(layer.receive(channel), timeout=5)

    try:
        with django_capture_on_commit_callbacks(execute=True):
            credit_grant(team_id=team.id, amount=7 * USD, reason="x", idempotency_key="push")
        message = async_to_sync(next_message)()
    finally:
        async_to_sync(layer.group_discard)(team_group(team.id), channel)
    assert message == {"type": "team.event", "event": "balance.changed", "data": {
        "available": "7.000000", "held": "0.000000", "earnings": "0.000000",
        "available_display": "$7.00", "held_display": "$0.00",
    }}  # fmt: skip


# --- combined captures (the metering sweep charges GPU time and storage at once) ---------------


@pytest.fixture
def swept(team, owner):
    """Two sweeps through holds_settle_usage: rental:10 is charged GPU time and storage
    together twice, rental:11 GPU time only."""
    from billing.metering import HoldUsage

    provider = TeamFactory(name="Sweep Host")
    credit_grant(team_id=team.id, amount=100 * USD, reason="w", idempotency_key="sw")
    both, gpu_only = (
        hold_create(
            team_id=team.id, provider_team_id=provider.id, amount=20 * USD,
            reference=f"rental:{n}", idempotency_key=f"sweep-hold-{n}",
            machine_reference="machine:9",
        )
        for n in (10, 11)
    )  # fmt: skip
    holds_settle_usage(
        [HoldUsage(both.pk, gpu=2 * USD, storage=USD // 2), HoldUsage(gpu_only.pk, USD, 0)]
    )
    holds_settle_usage([HoldUsage(both.pk, gpu=3 * USD, storage=USD)])
    return {"both": both, "gpu_only": gpu_only, "provider": provider}


def test_a_combined_capture_is_split_by_kind_on_the_invoice_and_counted_once(
    client, owner, team, swept
):
    from billing.selectors import invoice_for_month
    from tests.billing.ledger_checks import assert_ledger_consistent

    assert_ledger_consistent()
    capture = Transfer.objects.filter(hold=swept["both"], kind="capture").first()
    assert (capture.usage_kind, capture.amount, capture.storage_amount) == (
        "gpu+storage", 2_500_000, 500_000,
    )  # fmt: skip
    invoice = invoice_for_month(Entry.objects.filter(team=team), timezone.localdate())
    lines = {(line.reference, line.usage_kind): line for line in invoice.lines}
    assert {key: (line.amount, line.charges) for key, line in lines.items()} == {
        ("rental:10", "gpu"): (3 * USD, 2),
        ("rental:10", "storage"): (USD, 2),
        ("rental:11", "gpu"): (USD, 1),
    }
    assert invoice.total == 5 * USD and invoice.charges == 3 and invoice.line_charges == 5

    month = timezone.localdate().strftime("%Y-%m")
    html = client_for(client, owner, team).get(f"/billing/invoices/{month}/").content.decode()
    # The page lists one row per rental, amounts only (a combined charge's count on both
    # usage kinds' lines no longer shows a charges column that outgrows the total).
    assert "$5.00" in html and "$4.00" in html and "GPU time $3.00 · storage $1.00" in html
    assert "Charges</th>" not in html

    body = key_client(team).get(f"/api/v1/billing/invoices/{month}/").json()
    assert body["charges"] == 3 and body["total"] == "5.000000"
    assert sorted((line["usage_kind"], line["amount"], line["charges"]) for line in body["lines"]) == [
        ("gpu", "1.000000", 1), ("gpu", "3.000000", 2), ("storage", "1.000000", 2),
    ]  # fmt: skip


def test_ledger_csv_and_api_show_the_gpu_and_storage_parts(client, owner, team, swept):
    response = client_for(client, owner, team).get(
        "/billing/ledger.csv", {"reference": "rental:10"}
    )
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    charges = [row for row in rows if row["kind"] == "capture"]
    assert sorted((r["usage"], r["amount_usd"], r["gpu_usd"], r["storage_usd"]) for r in charges) == [
        ("gpu+storage", "-1.500000", "1.000000", "0.500000"),
        ("gpu+storage", "-2.500000", "2.000000", "0.500000"),
    ]  # fmt: skip
    hold_row = next(row for row in rows if row["kind"] == "hold" and row["account"] == "held")
    assert hold_row["gpu_usd"] == hold_row["storage_usd"] == ""

    api = key_client(team)
    ledger = api.get("/api/v1/billing/ledger/").json()["results"]
    by_kind = {}
    for row in ledger:
        by_kind.setdefault((row["kind"], row["usage_kind"]), []).append(row)
    gpu_only = by_kind[("capture", "gpu")][0]
    assert (gpu_only["amount"], gpu_only["gpu_amount"], gpu_only["storage_amount"]) == (
        "-1.000000", "1.000000", "0.000000",
    )  # fmt: skip
    combined = sorted(
        (row["amount"], row["gpu_amount"], row["storage_amount"])
        for row in by_kind[("capture", "gpu+storage")]
    )
    assert combined == [
        ("-1.500000", "1.000000", "0.500000"), ("-2.500000", "2.000000", "0.500000"),
    ]  # fmt: skip
    hold = by_kind[("hold", "")][0]
    assert hold["gpu_amount"] is None and hold["storage_amount"] is None

    schema = api.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    entry = schema["components"]["schemas"]["Entry"]["properties"]
    assert entry["gpu_amount"]["nullable"] and "GPU time part" in entry["gpu_amount"]["description"]
    assert "storage part" in entry["storage_amount"]["description"]
    assert "gpu+storage" in entry["usage_kind"]["description"]
    invoice = schema["components"]["schemas"]["Invoice"]["properties"]
    assert "counted once" in invoice["charges"]["description"]


def test_earnings_count_a_charge_whose_fee_took_all_of_it(client, team, owner):
    """With a 10% fee rounded half up on cumulative charges, a hold charged 4 µ$ pays no fee
    and its next 1 µ$ pays 1 µ$ of fee: the provider nets nothing from that charge, yet their
    earnings pages must still show its gross and fee."""
    from billing.metering import HoldUsage
    from tests.billing.ledger_checks import assert_ledger_consistent
    from tests.factories import UserFactory, add_member

    provider = TeamFactory(name="Tiny Host")
    credit_grant(team_id=team.id, amount=USD, reason="w", idempotency_key="tiny")
    one, two = (
        hold_create(
            team_id=team.id, provider_team_id=provider.id, amount=USD // 10,
            reference=f"rental:{n}", idempotency_key=f"tiny-{n}", machine_reference=f"machine:{n}",
        )
        for n in (7, 8)
    )  # fmt: skip
    hold_capture_usage(hold_id=one.pk, kind="gpu", owed_total=4)
    hold_capture_usage(hold_id=one.pk, kind="gpu", owed_total=5)  # fee 1 of 1
    holds_settle_usage([HoldUsage(two.pk, gpu=4, storage=0)])
    holds_settle_usage([HoldUsage(two.pk, gpu=4, storage=1)])  # the sweep's, likewise
    fee_only = Transfer.objects.filter(kind="capture", amount=1, fee=1)
    assert fee_only.count() == 2
    for transfer in fee_only:
        legs = sorted(transfer.entries.filter(team=provider).values_list("amount", flat=True))
        assert legs == [-1, 1]  # the gross in, the fee back out
    assert_ledger_consistent()

    add_member(provider, UserFactory(username="tiny-host"), "owner")
    body = key_client(provider).get("/api/v1/billing/earnings/").json()
    rows = {row["machine_reference"]: row for row in body["by_machine"]}
    for machine in ("machine:7", "machine:8"):
        assert rows[machine] == {
            "machine_reference": machine, "gross": "0.000005", "fee": "0.000001",
            "net": "0.000004",
        }  # fmt: skip
    assert [(day["gross"], day["fee"], day["net"]) for day in body["by_day"]] == [
        ("0.000010", "0.000002", "0.000008")
    ]
    host = provider.memberships.get().user
    html = client_for(client, host, provider).get("/earnings/").content.decode()
    # The page reads to the cent: a non-zero sub-cent amount is "<$0.01", never "$0.00".
    assert html.count("&lt;$0.01") >= 3 and "$0.00001" not in html
