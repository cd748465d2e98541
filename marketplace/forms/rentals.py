"""The renter console's forms. A field is parsed in one place: these read the console's text
formats (env as KEY=value lines, ports as a comma or space separated list, arguments split like
a shell would) and hand the result to the API's serializers, whose field rules and messages
both doors then share; the serializer builds the ``RentalRequest`` for both. The rules of the
business (what may run, the machine's terms, the extension's range) stay in the services."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from rest_framework import serializers

from marketplace.api.rent_requests import ExtendSerializer, RentSerializer
from marketplace.api.rentals import BidSerializer, ExecSerializer
from marketplace.forms.base import ConsoleForm, whole_number
from marketplace.rentals.renting import RentalRequest


def env_from_lines(text: str) -> dict[str, str]:
    """``KEY=value`` lines (blank lines skipped); the value is kept as typed, spaces and all."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if "=" not in line:
            raise forms.ValidationError(f"Line {number} is not KEY=value.")
        key, value = line.split("=", 1)
        env[key.strip()] = value
    return env


def ports_from_text(text: str) -> list[int]:
    """Port numbers separated by commas or spaces; their range is the serializer's rule."""
    ports = []
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        if not item.isdigit() or not item.isascii():
            raise forms.ValidationError(f"'{item[:20]}' is not a port number.")
        ports.append(int(item))
    return ports


def args_from_shell_words(text: str) -> list[str]:
    """Arguments as a shell would split them (quotes group words); no shell ever runs them:
    each becomes one element of the container's argv."""
    try:
        return shlex.split(text)
    except ValueError as error:  # an unclosed quote
        raise forms.ValidationError(f"Cannot split the arguments: {error}.") from None


def serializer_messages(detail: Any) -> list[str]:
    """A serializer's errors for one field as plain messages. A list field's errors come by
    position and a dict field's by key: the key (an env name) is kept, a position is not."""
    if isinstance(detail, dict):
        return [
            f"{key}: {message}" if isinstance(key, str) else message
            for key, value in detail.items()
            for message in serializer_messages(value)
        ]
    if isinstance(detail, list):
        return [message for item in detail for message in serializer_messages(item)]
    return [str(detail)]


class SerializerForm(ConsoleForm):
    """A console form whose fields, once read from text, are checked by an API serializer."""

    serializer_class: type[serializers.Serializer]
    partial = False  # True: only the fields sent are checked (a change, not a whole spec)

    def serializer_data(self) -> dict[str, Any]:
        return dict(self.cleaned_data)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:  # text that did not parse; the serializer would only repeat it
            return cleaned
        extra = {"partial": True} if self.partial else {}  # some serializers fix it themselves
        self.serializer = self.serializer_class(data=self.serializer_data(), **extra)
        if not self.serializer.is_valid():
            for field, detail in self.serializer.errors.items():
                self._add_serializer_error(field, serializer_messages(detail))
        return cleaned

    def _add_serializer_error(self, field: str, messages: list[str]) -> None:
        if field in self.fields:
            self.add_error(field, messages)
        else:  # a field the page has no input for (the machine, from the URL): named here
            self.add_error(None, [f"{field.replace('_', ' ')}: {m}" for m in messages])

    def validated(self) -> dict[str, Any]:
        self.parsed()
        return self.serializer.validated_data


class WholeNumberText(forms.Field):
    """A whole, non-negative number typed into a number input. Left out of the post it is
    ``absent``; sent empty it is refused like any other text that is no number."""

    def __init__(self, *, absent: int | None = None, **kwargs: Any) -> None:
        self.absent = absent
        super().__init__(required=False, **kwargs)

    def to_python(self, value: str | None) -> int:
        if value is None and self.absent is not None:
            return self.absent
        try:
            return whole_number(value)
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None


class TextFormatField(forms.Field):
    """A textarea or input in one of the console's text formats, read by ``parse``; what the
    values may hold (NUL characters, lengths) is the serializer's and the services' rule."""

    def __init__(self, parse: Callable[[str], Any], **kwargs: Any) -> None:
        self.parse = parse
        super().__init__(required=False, **kwargs)

    def to_python(self, value: str | None) -> Any:
        return self.parse(value or "")


class RentForm(SerializerForm):
    """The offers page's rent dialog, for the machine in the URL."""

    serializer_class = RentSerializer

    num_gpus = WholeNumberText()
    # Read by the serializer's finite-number rule, the API's own ("NaN" is refused there).
    duration_hours = forms.CharField(required=False, strip=False)
    disk_gb = WholeNumberText(absent=10)
    launch_mode = forms.CharField(required=False)
    image = forms.CharField(required=False)
    entrypoint = forms.CharField(required=False)
    args = TextFormatField(args_from_shell_words)
    env = TextFormatField(env_from_lines)
    ports = TextFormatField(ports_from_text)
    registry_username = forms.CharField(required=False)
    registry_password = forms.CharField(required=False, strip=False)
    # "slice" rents part of one card (offers that share) instead of num_gpus whole GPUs;
    # "bid" rents whole GPUs interruptibly at bid_price.
    rent_kind = forms.CharField(required=False)
    bid_price = forms.CharField(required=False)
    core_percent = WholeNumberText(absent=0)
    memory_mb = WholeNumberText(absent=0)
    card_policy = forms.CharField(required=False)
    # One of the team's volumes on this machine, and where it goes (/data when left empty).
    volume = forms.CharField(required=False)
    volume_target = forms.CharField(required=False)

    def __init__(self, data: Any, *, machine_id: int) -> None:
        self.machine_id = machine_id
        super().__init__(data)
        if data.get("rent_kind") == "slice":  # part of one GPU: the GPU count is not asked
            self.fields["num_gpus"] = WholeNumberText(absent=1)

    def serializer_data(self) -> dict[str, Any]:
        data = {**self.cleaned_data, "machine_id": self.machine_id}
        if not data["launch_mode"]:
            del data["launch_mode"]  # the serializer's default: the image's entrypoint
        core, memory = data.pop("core_percent"), data.pop("memory_mb")
        bid = data.pop("bid_price").strip()
        if data["rent_kind"] == "bid":
            data["bid_price"] = bid or None
        if data.pop("rent_kind") == "slice":
            data["gpu_share"] = {"core_percent": core, "memory_mb": memory}
            del data["num_gpus"]
        if not data["card_policy"]:
            del data["card_policy"]
        volume, target = data.pop("volume").strip(), data.pop("volume_target").strip()
        data["volumes"] = [{"volume": volume, "target": target or "/data"}] if volume else []
        return data

    def _add_serializer_error(self, field: str, messages: list[str]) -> None:
        if field == "gpu_share":  # its parts have inputs of their own; the message names them
            self.add_error(None, [f"GPU slice: {m}" for m in messages])
            return
        super()._add_serializer_error(field, messages)

    def rental_request(self) -> RentalRequest:
        self.parsed()
        return self.serializer.rental_request()


class NewVersionForm(forms.Form):
    """The Versions card's form: the fields typed in are the new version's changes (an
    empty box leaves that field as it is)."""

    image = forms.CharField(required=False)
    env = forms.CharField(required=False, strip=False)
    args = forms.CharField(required=False, strip=False)
    ports = forms.CharField(required=False)
    disk_gb = forms.IntegerField(required=False, min_value=1, max_value=100_000)

    def changes(self) -> dict[str, Any]:
        if not self.is_valid():
            raise ValidationError(self.errors)
        data, changes = self.cleaned_data, {}
        if data["image"].strip():
            changes["image"] = data["image"].strip()
        if data["ports"].strip():
            words = data["ports"].replace(",", " ").split()
            if words == ["none"]:
                changes["ports"] = []
            elif all(w.isdigit() and 1 <= int(w) <= 65535 for w in words) and len(words) <= 16:
                changes["ports"] = [int(w) for w in words]
            else:
                raise ValidationError(
                    {"ports": "Container ports 1-65535, like 8080 9000 (or none)."}
                )
        if data["disk_gb"] is not None:
            changes["disk_gb"] = data["disk_gb"]
        try:
            if data["env"].strip():
                changes["env"] = env_from_lines(data["env"])
            if data["args"].strip():
                changes["args"] = args_from_shell_words(data["args"])
        except forms.ValidationError as error:
            raise ValidationError(
                {"env" if "Line" in str(error) else "args": error.messages}
            ) from None
        if not changes:
            raise ValidationError(
                {"image": "Change the image, the environment, the arguments, ports or disk."}
            )
        return changes


class ExtendForm(SerializerForm):
    serializer_class = ExtendSerializer

    hours = forms.CharField(required=False, strip=False)

    def hours_value(self) -> float:
        return self.validated()["hours"]


class BidForm(SerializerForm):
    serializer_class = BidSerializer

    bid_price = forms.CharField(required=False, strip=False)

    def bid_value(self) -> int:
        return self.validated()["bid_price"]


class ExecForm(SerializerForm):
    """A command for the instance page's "Run a command" box; its refusal is shown bare, in
    the box's own place, not as a page message."""

    serializer_class = ExecSerializer

    command = forms.CharField(required=False, strip=False)

    def command_text(self) -> str:
        return self.validated()["command"]

    def refusal(self) -> str:
        return " ".join(message for messages in self.errors.values() for message in messages)


class SshKeyForm(ConsoleForm):
    """A key to add; the key service checks the name and the key line and says what is wrong."""

    name = forms.CharField(required=False)
    public_key = forms.CharField(required=False, strip=False)


class SshKeyRemoveForm(ConsoleForm):
    delete = forms.IntegerField(min_value=1, max_value=2**63 - 1)

    def key_id(self) -> int | None:
        """The key to remove, or None when the post names no key id at all."""
        try:
            return self.parsed()["delete"]
        except ValidationError:
            return None
