"""The host console's forms read each posted field once and name the one that is wrong."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.core.exceptions import ValidationError

from marketplace.forms.hosts import (
    MachineAddForm,
    MachineTermsForm,
    MaintenanceCancelForm,
    MaintenanceWindowForm,
)


def refusal(form) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        form.parsed()
    return caught.value.message_dict


def test_terms_are_read_in_micro_dollars_and_empty_counts_take_their_defaults():
    terms = MachineTermsForm({"price": "0.85", "storage_price": "$1,000", "location": "EU"})
    parsed = terms.parsed()
    assert parsed["price"] == 850_000 and parsed["storage_price"] == 1_000_000_000
    assert (parsed["min_gpus"], parsed["port_range_start"], parsed["port_range_end"]) == (1, 0, 0)
    assert parsed["end_date"] is None


def test_every_bad_terms_field_is_named_with_its_reason():
    errors = refusal(
        MachineTermsForm(
            {"price": "-3", "storage_price": "abc", "min_gpus": "two", "end_date": "June"}
        )
    )
    assert errors["price"] == ["The amount must not be negative."]
    assert "is not an amount in dollars" in errors["storage_price"][0]
    assert errors["min_gpus"] == ["A whole number."]
    assert errors["end_date"] == ["Use a date like 2027-06-30."]


def test_maintenance_moments_are_utc_and_a_bad_one_is_named():
    window = MaintenanceWindowForm({"starts_at": "2027-06-30T22:00", "ends_at": "2027-07-01T02:00"})
    assert window.parsed()["starts_at"] == datetime(2027, 6, 30, 22, 0, tzinfo=UTC)
    errors = refusal(MaintenanceWindowForm({"starts_at": "tomorrow"}))
    assert errors == {
        "starts_at": ["Use a date and time like 2027-06-30 22:00."],
        "ends_at": ["Use a date and time like 2027-06-30 22:00."],
    }


@pytest.mark.parametrize("window", ["", "x", "0", "99999999999999999999999"])
def test_a_window_that_cannot_exist_is_refused_by_name(window):
    assert refusal(MaintenanceCancelForm({"window": window})) == {
        "window": ["No such maintenance window."]
    }


def test_adding_a_machine_defaults_port_and_user_and_names_a_bad_port():
    parsed = MachineAddForm({"address": "gpu1.example.com"}).parsed()
    assert (parsed["port"], parsed["ssh_user"]) == (22, "root")
    assert MachineAddForm({"address": "a", "ssh_user": ""}).parsed()["ssh_user"] == ""
    assert refusal(MachineAddForm({"address": "a", "port": "ssh"})) == {"port": ["A whole number."]}
