"""The money pages as a person reads them (issue 33 §5): one ledger row per hold event, rentals
and machines by name, invoice lines that say what was rented and add up to the total. The CSV
export and the API keep every entry and every reference."""

from __future__ import annotations

import csv
import io
import re

import pytest

from billing.holds import hold_capture_usage, hold_release
from billing.models import Entry
from hosts.models import Gpu
from tests.conftest import client_for, key_client
from tests.factories import UserFactory, add_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def renter(client, renter_team):
    user = UserFactory(username="renter")
    add_member(renter_team, user, "owner")
    return client_for(client, user, renter_team)


@pytest.fixture
def named_rental(rent):
    """A labelled 2-GPU rental on machine "m1" (RTX 4090s), charged GPU time, then released."""
    for index in range(2):
        Gpu.objects.create(
            machine=rent.machine, index=index, uuid=f"GPU-{index}", name="NVIDIA RTX 4090",
            memory_mib=24564,
        )  # fmt: skip
    rental = rent(gpus=2, hold=10_000_000)
    rental.instance.label = "train-llama"
    rental.instance.save(update_fields=["label"])
    hold_capture_usage(hold_id=rental.hold_id, kind="gpu", owed_total=2_400_000)
    hold_release(hold_id=rental.hold_id)
    return rental


def _ledger_table(page: str) -> str:
    return page.split('id="ledger"')[1].split("</table>")[0]


def _cells(row: str) -> list[str]:
    return [re.sub(r"<[^>]+>", " ", cell).split() for cell in re.findall(r"<td.*?</td>", row, re.S)]


def test_a_hold_event_is_one_ledger_row_naming_the_rental(renter, renter_team, named_rental):
    ledger = _ledger_table(renter.get("/billing/").content.decode())
    rows = re.findall(r"<tr>.*?</tr>", ledger.split("<tbody>")[1], re.S)
    # The grant, the hold, the charge, the release: four events, four rows (was six).
    assert len(rows) == 4, rows
    hold_row = next(row for row in rows if "Hold placed" in row)
    assert "train-llama" in hold_row and "2× NVIDIA RTX 4090 on m1" in hold_row
    assert "$10.00" in hold_row and "Available → Held" in hold_row
    assert f"rental:{named_rental.instance_id}" not in ledger  # the name, not the id
    release_row = next(row for row in rows if "Hold released" in row)
    assert "$7.60" in release_row and "Held → Available" in release_row

    # The export and the API keep both legs of each hold event.
    entries = Entry.objects.filter(team=renter_team).count()
    export = b"".join(renter.get("/billing/ledger.csv").streaming_content).decode()
    assert len(list(csv.DictReader(io.StringIO(export)))) == entries == 6
    assert f"rental:{named_rental.instance_id}" in export
    api = key_client(renter_team).get("/api/v1/billing/ledger/").json()
    assert api["count"] == 6


def test_active_holds_name_the_rental(renter, rent):
    rental = rent(gpus=1)
    page = renter.get("/billing/").content.decode()
    holds = page.split('id="active-holds"')[1].split("</table>")[0]
    assert "busybox" in holds and "on m1" in holds
    assert f'href="/instances/{rental.instance_id}/"' in holds


# --- invoices ----------------------------------------------------------------------------------


def _dollars(text: str) -> int:
    """'$1,234.56' / '−$0.01' / '+$0.01' → cents."""
    sign = -1 if text.startswith(("−", "-")) else 1
    return sign * round(float(re.sub(r"[^0-9.]", "", text)) * 100)


def _invoice_sums(page: str) -> tuple[list[int], int]:
    """The cents of every amount listed in the invoice's Amount column, and its total."""
    table = page.split('id="invoice-lines"')[1].split("</table>")[0]
    listed = re.findall(r'class="num line-amount">([^<]+)<', table)
    total = re.search(r'class="num invoice-total">([^<]+)<', table).group(1)
    return [_dollars(amount) for amount in listed], _dollars(total)


def test_invoice_lines_name_what_was_rented_and_add_up_to_the_total(renter, rent, named_rental):
    """GPU time and storage charged together (the metering sweep) once made the page's charges
    column add up to more than its total; the rows listed now sum to the total shown."""
    from django.utils import timezone

    from billing.metering import HoldUsage, holds_settle_usage

    swept = rent(gpus=1, hold=20_000_000)
    holds_settle_usage([HoldUsage(swept.hold_id, gpu=600_000, storage=100_000)])
    holds_settle_usage([HoldUsage(swept.hold_id, gpu=1_200_000, storage=200_000)])
    month = timezone.localdate().strftime("%Y-%m")
    page = renter.get(f"/billing/invoices/{month}/").content.decode()

    listed, total = _invoice_sums(page)
    assert len(listed) == 2 and sum(listed) == total == 240 + 140  # $2.40 + $1.40
    assert "2× NVIDIA RTX 4090</strong> on m1" in page and "train-llama" in page
    # $2.40 of GPU time at $0.60 a GPU-hour is 4 GPU-hours (2 GPUs, 2 hours); $1.20 is 2.
    assert '"num">4.00<' in page and '"num">2.00<' in page
    assert page.count("$0.60/GPU-h") == 2
    assert "GPU time $1.20 · storage $0.20" in page
    assert "Charges</th>" not in page


def test_rows_rounded_to_the_cent_still_add_up(renter, rent):
    from django.utils import timezone

    for _ in range(2):  # each $1.005: $1.01 a row, $2.01 in all
        rental = rent(gpus=1, hold=5_000_000)
        hold_capture_usage(hold_id=rental.hold_id, kind="gpu", owed_total=1_005_000)
    month = timezone.localdate().strftime("%Y-%m")
    page = renter.get(f"/billing/invoices/{month}/").content.decode()
    listed, total = _invoice_sums(page)
    assert listed == [101, 101, -1] and total == 201
    assert "Rounding to the cent" in page
    pdf = renter.get(f"/billing/invoices/{month}/pdf/")
    assert pdf.status_code == 200


def test_earnings_name_the_machine(client, provider_team, named_rental):
    host = UserFactory(username="host")
    add_member(provider_team, host, "owner")
    page = client_for(client, host, provider_team).get("/earnings/").content.decode()
    machine = named_rental.machine
    assert f'<a href="/machines/{machine.pk}/">m1</a>' in page
    assert f"machine:{machine.pk}" not in page
    body = key_client(provider_team).get("/api/v1/billing/earnings/").json()
    assert body["by_machine"][0]["machine_reference"] == f"machine:{machine.pk}"


# --- the ledger's Reference filter finds rows by the names the page shows ----------------------


def _ledger_rows(client, reference: str) -> list[str]:
    page = client.get("/billing/", {"reference": reference}).content.decode()
    if 'id="ledger"' not in page:
        return []
    return re.findall(r"<tr>.*?</tr>", _ledger_table(page).split("<tbody>")[1], re.S)


def _exported(client, reference: str) -> list[dict]:
    export = client.get("/billing/ledger.csv", {"reference": reference})
    return list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))


def test_the_reference_filter_finds_a_rentals_rows_by_its_shown_names(
    renter, renter_team, named_rental, rent
):
    plain = rent(gpus=1, hold=5_000_000)  # no label: the page calls it by its image, busybox
    named_refs = {f"rental:{named_rental.instance_id}"}
    # The hold, the charge, the release of the labelled rental: its three rows, nothing else.
    for typed in ("train-llama", "LLAMA", "2× NVIDIA RTX 4090 on m1", "2× nvidia"):
        rows = _ledger_rows(renter, typed)
        assert len(rows) == 3, (typed, rows)
        assert all("train-llama" in row for row in rows), typed
    exported = _exported(renter, "train-llama")
    assert {row["reference"] for row in exported} == named_refs
    assert len(exported) == 5  # every entry: the hold's and the release's two legs each

    # The unlabelled one by its image and its GPUs; the labelled one's image is not its name.
    rows = _ledger_rows(renter, "busybox")
    assert len(rows) == 1 and "1× NVIDIA RTX 4090 on m1" in rows[0]
    assert len(_ledger_rows(renter, "1× NVIDIA")) == 1
    # Both by their machine, and the reference itself still works.
    assert len(_ledger_rows(renter, "on m1")) == 4
    assert len(_ledger_rows(renter, f"rental:{plain.instance_id}")) == 1
    assert _ledger_rows(renter, "no-such-name") == []


def test_the_reference_filter_looks_only_among_the_viewing_teams_own_objects(
    client, provider_team, named_rental
):
    """The provider's earnings rows carry the renter's rental reference: the renter's label
    must not find them (it would tell the provider what renters call their rentals), while the
    provider's own machine name does, and the page names that machine."""
    host = UserFactory(username="host")
    add_member(provider_team, host, "owner")
    provider = client_for(client, host, provider_team)
    assert _ledger_rows(provider, "train-llama") == []
    assert _exported(provider, "train-llama") == []
    rows = _ledger_rows(provider, "m1")
    assert len(rows) == 1 and "on m1" in rows[0] and "Usage charge" in rows[0]
    assert "train-llama" not in provider.get("/billing/").content.decode()
