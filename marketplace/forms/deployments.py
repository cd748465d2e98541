"""The console's deployment forms. As for renting, they read the console's text formats (GPU
models and regions as comma separated lists, env as KEY=value lines, arguments split like a
shell would) and hand the fields to the API's ``DeploymentInputSerializer``, so each field has
one rule and one message on both doors; the deployment services check the spec as a whole."""

from __future__ import annotations

from typing import Any

from django import forms

from marketplace.api.deployments import DeploymentInputSerializer
from marketplace.deployments.services import DeploymentSpec
from marketplace.forms.rentals import (
    SerializerForm,
    TextFormatField,
    args_from_shell_words,
    env_from_lines,
    ports_from_text,
)


def names_from_text(text: str) -> list[str]:
    """Comma separated names ("RTX 4090, A100"); blanks between commas are skipped."""
    return [name.strip() for name in text.split(",") if name.strip()]


# Left empty, these take the serializer's default (the same as the API's when a field is left
# out): no price cap, no budget, a replica set, the image's entrypoint and so on.
OPTIONAL = (
    "mode", "launch_mode", "gpus_per_replica", "replicas", "completions",
    "max_price_per_gpu_hour", "min_reliability", "policy", "duration_hours", "budget_usd",
    "disk_gb", "backoff_limit",
)  # fmt: skip


class DeploymentForm(SerializerForm):
    """The deployments page's create form."""

    serializer_class = DeploymentInputSerializer

    name = forms.CharField(required=False)
    mode = forms.CharField(required=False)
    image = forms.CharField(required=False)
    launch_mode = forms.CharField(required=False)
    entrypoint = forms.CharField(required=False)
    args = TextFormatField(args_from_shell_words)
    env = TextFormatField(env_from_lines)
    ports = TextFormatField(ports_from_text)
    disk_gb = forms.CharField(required=False)
    gpu_names = TextFormatField(names_from_text)
    gpus_per_replica = forms.CharField(required=False)
    replicas = forms.CharField(required=False)
    completions = forms.CharField(required=False)
    backoff_limit = forms.CharField(required=False)
    # Dollars per GPU-hour and dollars, read by the API's money rule.
    max_price_per_gpu_hour = forms.CharField(required=False)
    regions = TextFormatField(names_from_text)
    min_reliability = forms.CharField(required=False)
    policy = forms.CharField(required=False)
    duration_hours = forms.CharField(required=False)
    budget_usd = forms.CharField(required=False)

    def serializer_data(self) -> dict[str, Any]:
        return {
            name: value
            for name, value in self.cleaned_data.items()
            if not (name in OPTIONAL and value == "")
        }

    def spec(self) -> DeploymentSpec:
        self.parsed()
        return DeploymentSpec(**self.serializer.spec_values())


class DeploymentChangeSerializer(DeploymentInputSerializer):
    """The input serializer as PATCH uses it: only the fields given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)


# The create form's conditions: what the "N machines match now" count reads as it is typed.
CONDITIONS = (
    "gpu_names", "gpus_per_replica", "max_price_per_gpu_hour", "regions", "min_reliability",
    "disk_gb",
)  # fmt: skip


class ConditionsForm(SerializerForm):
    """The create form's conditions alone (sent by the live match count), checked by the same
    serializer rules; a field left empty takes its default."""

    serializer_class = DeploymentChangeSerializer

    gpu_names = TextFormatField(names_from_text)
    gpus_per_replica = forms.CharField(required=False)
    max_price_per_gpu_hour = forms.CharField(required=False)
    regions = TextFormatField(names_from_text)
    min_reliability = forms.CharField(required=False)
    disk_gb = forms.CharField(required=False)

    def serializer_data(self) -> dict[str, Any]:
        return {name: value for name, value in self.cleaned_data.items() if value not in ("", [])}

    def conditions(self) -> dict[str, Any]:
        """The conditions under the Deployment model's names; defaults for those not given."""
        self.parsed()
        defaults = DeploymentInputSerializer()
        values = {
            name: defaults.fields[name].get_default()
            for name in CONDITIONS
            if name not in self.serializer.validated_data
        }
        return {**values, **self.serializer.validated_data}


class ScaleForm(SerializerForm):
    """The deployment page's scale form: how many replicas at once."""

    serializer_class = DeploymentChangeSerializer

    replicas = forms.CharField(required=False)

    def changes(self) -> dict[str, Any]:
        self.parsed()
        return self.serializer.spec_values()
