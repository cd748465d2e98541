"""The host console's forms: each posted field is parsed in one place, and a bad one is refused
naming the field before any service runs. The rules of the business (price bounds, port
ranges, whether a window may be planned) stay in ``hosts.services``; these only read text."""

from __future__ import annotations

from datetime import UTC, datetime, time

from django import forms
from django.utils import timezone

from billing.errors import InvalidAmount
from billing.money import parse_usd
from marketplace.forms.base import ConsoleForm, WholeNumberField

MOMENT_FORMAT = "%Y-%m-%dT%H:%M"  # what a ``datetime-local`` input posts
MOMENT_HINT = "Use a date and time like 2027-06-30 22:00."
NO_SUCH_WINDOW = "No such maintenance window."
PK_MAX = 2**63 - 1  # the largest id a bigint column holds


class DollarsField(forms.Field):
    """Dollars typed as text (``"0.85"``, ``"$1,000"``), cleaned to integer micro-dollars by
    the billing room's parser, which has the one set of rules and messages for money."""

    def to_python(self, value: str | None) -> int:
        try:
            return parse_usd(value or "")
        except InvalidAmount as error:
            raise forms.ValidationError(str(error)) from None


class OptionalDollarsField(DollarsField):
    """Dollars, or nothing (empty: None)."""

    def to_python(self, value: str | None) -> int | None:
        return super().to_python(value) if (value or "").strip() else None


class UtcMomentField(forms.Field):
    """A ``datetime-local`` input, read as UTC (the page says so beside the field)."""

    def to_python(self, value: str | None) -> datetime:
        try:
            moment = datetime.strptime((value or "").strip(), MOMENT_FORMAT)
        except ValueError:
            raise forms.ValidationError(MOMENT_HINT) from None
        return moment.replace(tzinfo=UTC)


class MachineAddForm(ConsoleForm):
    name = forms.CharField(required=False, strip=False)
    address = forms.CharField(required=False, strip=False)
    port = WholeNumberField(default=22)
    ssh_user = forms.CharField(required=False)

    def clean_ssh_user(self) -> str:
        # Left out of the post, the user is root; sent empty, the service refuses it by name.
        return self.cleaned_data["ssh_user"] if "ssh_user" in self.data else "root"


class HostKeyConfirmForm(ConsoleForm):
    # The service compares it with the key the machine presented, and says so when it differs.
    fingerprint = forms.CharField(required=False)


class MachineTermsForm(ConsoleForm):
    price = DollarsField()
    storage_price = DollarsField()
    min_gpus = WholeNumberField(default=1)
    end_date = forms.DateField(
        required=False, input_formats=["%Y-%m-%d"],
        error_messages={"invalid": "Use a date like 2027-06-30."},
    )  # fmt: skip
    location = forms.CharField(required=False)
    # Empty: the machine takes no bids (interruptible rentals).
    min_bid = OptionalDollarsField(required=False)
    # 0 keeps the machine's current range.
    port_range_start = WholeNumberField(default=0)
    port_range_end = WholeNumberField(default=0)

    def clean_end_date(self) -> datetime | None:
        """The last minute of the chosen day: the machine is available through that day."""
        day = self.cleaned_data["end_date"]
        return timezone.make_aware(datetime.combine(day, time(23, 59))) if day else None


class MachineFirewallForm(ConsoleForm):
    """The private ranges rentals may not reach: CIDRs separated by commas, spaces or lines
    (empty: none beyond the host and link-local addresses)."""

    blocked_ranges = forms.CharField(required=False, max_length=2000)

    def clean_blocked_ranges(self) -> list[str]:
        return self.cleaned_data["blocked_ranges"].replace(",", " ").split()


class MachineSharingForm(ConsoleForm):
    """GPU sharing on or off (a checkbox: absent means off) and the smallest slice."""

    enabled = forms.BooleanField(required=False)
    min_core_percent = WholeNumberField(default=10)


class MaintenanceWindowForm(ConsoleForm):
    starts_at = UtcMomentField()
    ends_at = UtcMomentField()
    note = forms.CharField(required=False, strip=False)


class MaintenanceCancelForm(ConsoleForm):
    window = forms.IntegerField(
        min_value=1,
        max_value=PK_MAX,
        error_messages=dict.fromkeys(
            ("required", "invalid", "min_value", "max_value"), NO_SUCH_WINDOW
        ),
    )
