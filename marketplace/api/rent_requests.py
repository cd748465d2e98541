"""What a rent request says, read and checked: the body of ``POST /api/v1/instances/`` (and of
the console's rent form, the vast translation and a template's rent, which hand theirs to the
same serializer), and the hours of an extension."""

from __future__ import annotations

import functools

from rest_framework import serializers

from marketplace.api.fields import DollarsField, FiniteFloatField, finite_number
from marketplace.rentals.renting import MAX_RENTAL_HOURS, MIN_RENTAL_HOURS, RentalRequest
from marketplace.rentals.volume_mounts import MountRequest
from marketplace.url_ids import MAX_ID
from scheduler.models import LaunchMode
from scheduler.placement import BINPACK, CARD_POLICIES, SliceSize

RENT_HOURS_RANGE = f"Rent for at least {MIN_RENTAL_HOURS} and at most {MAX_RENTAL_HOURS} hours."
EXTEND_HOURS_RANGE = f"Extend by at least {MIN_RENTAL_HOURS} and at most {MAX_RENTAL_HOURS} hours."
LAUNCH_MODE_CHOICE = f"Choose one of {', '.join(LaunchMode.values)}."


def hours_range_messages(text: str) -> dict[str, str]:
    return {"min_value": text, "max_value": text}


def reads_as_number(data) -> bool:
    """Whether ``data`` is a number at all, finite or not (a boolean is not)."""
    if isinstance(data, bool):
        return False
    try:
        float(data.strip() if isinstance(data, str) else data)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


class ExtensionHoursField(FiniteFloatField):
    """Hours to extend by. A number outside the range (NaN and infinities too) is refused with
    the range, which says more than "not finite"; only what is no number at all is refused as
    such."""

    def to_internal_value(self, data):
        try:
            return finite_number(data)
        except ValueError as error:
            if reads_as_number(data):
                raise serializers.ValidationError(EXTEND_HOURS_RANGE, code="max_value") from None
            raise serializers.ValidationError(str(error), code="invalid") from None


class GpuShareSerializer(serializers.Serializer):
    """A slice of one card (fractional GPU): a share of its compute and of its memory. Priced
    at the card's rate × the larger of the two fractions; CPU, RAM and disk follow that
    fraction of one unit."""

    core_percent = serializers.IntegerField(
        min_value=1, max_value=100, help_text="Percent of the card's compute (SMs)."
    )
    memory_mb = serializers.IntegerField(
        min_value=1, max_value=16 * 1024 * 1024, help_text="MB of the card's memory (MiB)."
    )


class MountSerializer(serializers.Serializer):
    volume = serializers.IntegerField(min_value=1, max_value=MAX_ID, help_text="A volume's id.")
    target = serializers.CharField(max_length=255, help_text="Where, e.g. /data.")


class RentSerializer(serializers.Serializer):
    """A rent request, from the API's JSON or the console's rent form (``RentForm`` reads the
    form's text into these fields); ``rental_request`` is what both hand to ``rental_create``.
    What may run (image, env, ports, entrypoint) is the renting service's check, whoever
    calls it."""

    machine_id = serializers.IntegerField(
        min_value=1, max_value=MAX_ID, help_text="The offer's machine_id."
    )
    num_gpus = serializers.IntegerField(
        min_value=1,
        max_value=64,
        required=False,
        help_text="Whole GPUs to rent (required unless gpu_share asks for a slice).",
    )
    gpu_share = GpuShareSerializer(
        required=False,
        allow_null=True,
        default=None,
        help_text="A slice of one card instead of whole GPUs (offers with sharing).",
    )
    card_policy = serializers.ChoiceField(
        choices=CARD_POLICIES,
        default=BINPACK,
        help_text="Which card a slice goes on: binpack (the fullest that fits) or spread "
        "(the emptiest).",
    )
    image = serializers.CharField(max_length=255)
    duration_hours = FiniteFloatField(
        min_value=MIN_RENTAL_HOURS,
        max_value=MAX_RENTAL_HOURS,
        error_messages=hours_range_messages(RENT_HOURS_RANGE),
    )
    disk_gb = serializers.IntegerField(min_value=1, max_value=100_000, default=10)
    launch_mode = serializers.ChoiceField(
        choices=LaunchMode.choices,
        default=LaunchMode.ENTRYPOINT,
        error_messages={"invalid_choice": LAUNCH_MODE_CHOICE},
    )
    # Values and arguments are kept exactly as sent: a space may matter to the program.
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=4096, trim_whitespace=False),
        default=dict,
    )
    ports = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=65535), default=list, max_length=16
    )
    entrypoint = serializers.CharField(max_length=255, allow_blank=True, default="")
    args = serializers.ListField(
        child=serializers.CharField(max_length=4096, allow_blank=True, trim_whitespace=False),
        default=list,
        max_length=64,
    )
    registry_username = serializers.CharField(
        max_length=255, allow_blank=True, default="", help_text="For a private registry."
    )
    registry_password = serializers.CharField(
        max_length=4096, allow_blank=True, default="", write_only=True, trim_whitespace=False,
        help_text="Stored encrypted; used only to pull the image.",
    )  # fmt: skip
    label = serializers.CharField(
        max_length=100, allow_blank=True, default="", help_text="Your own name for the instance."
    )
    volumes = serializers.ListField(
        child=MountSerializer(), default=list, max_length=8,
        help_text="Your volumes on this machine to mount, each at its path.",
    )  # fmt: skip
    bid_price = DollarsField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Rent interruptibly at this bid per GPU-hour (at least the offer's min_bid): "
        "an on-demand rental or a higher bid may take the GPUs, and the instance then waits, "
        "stopped, until it wins them back. Leave out to rent on demand.",
    )

    def validate(self, data):
        if data.get("gpu_share") is None and data.get("num_gpus") is None:
            raise serializers.ValidationError(
                {"num_gpus": "This field is required (or ask for a slice with gpu_share)."}
            )
        return data

    def rental_request(self) -> RentalRequest:
        return rental_request_of(self.validated_data)


def rental_request_of(data: dict) -> RentalRequest:
    """What ``rental_create`` is handed for a rent request's validated fields."""
    share = data.get("gpu_share")
    return RentalRequest(
        machine_id=data["machine_id"],
        gpu_count=data.get("num_gpus") or 1,
        gpu_slice=SliceSize(**share) if share else None,
        card_policy=data["card_policy"],
        image=data["image"],
        hours=data["duration_hours"],
        disk_gb=data["disk_gb"],
        launch_mode=data["launch_mode"],
        env=data["env"],
        ports=data["ports"],
        entrypoint=data["entrypoint"],
        args=data["args"],
        registry_username=data["registry_username"],
        registry_password=data["registry_password"],
        label=data["label"],
        volumes=tuple(
            MountRequest(volume_id=mount["volume"], target=mount["target"])
            for mount in data.get("volumes", [])
        ),
        bid=data.get("bid_price"),
    )


@functools.cache
def _rent_shape() -> RentSerializer:
    return RentSerializer()


def rent_request(data) -> RentalRequest:
    """A rent request's body, validated as ``RentSerializer(data=data).is_valid(raise_exception=
    True)`` does, through one serializer per process: a serializer deep-copies its declared
    fields each time it is made, several times what validating costs and a noticeable share
    of a rent's CPU (figures in docs/benchmarks.md). Its fields
    keep no state between uses. A body it refuses goes through a serializer of its own, so the
    400 is exactly the one ``is_valid`` gives."""
    try:
        return rental_request_of(_rent_shape().run_validation(data))
    except serializers.ValidationError:
        params = RentSerializer(data=data)  # the same refusal, in is_valid's own shape
        params.is_valid(raise_exception=True)
        return params.rental_request()


class ExtendSerializer(serializers.Serializer):
    hours = ExtensionHoursField(
        min_value=MIN_RENTAL_HOURS,
        max_value=MAX_RENTAL_HOURS,
        error_messages=hours_range_messages(EXTEND_HOURS_RANGE),
    )
