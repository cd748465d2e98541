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
