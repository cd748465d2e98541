"""The console's cluster forms: the console's text formats read, then the API's
``ClusterInputSerializer`` checks every field (one rule, one message on both doors)."""

from __future__ import annotations

from typing import Any

from django import forms

from marketplace.api.clusters import ClusterInputSerializer
from marketplace.clusters.services import ClusterSpec
from marketplace.forms.deployments import names_from_text
from marketplace.forms.rentals import (
    SerializerForm,
    TextFormatField,
    args_from_shell_words,
    env_from_lines,
)

OPTIONAL = ("gpus_per_replica", "replicas", "disk_gb", "duration_hours", "service_port")


class ClusterForm(SerializerForm):
    serializer_class = ClusterInputSerializer

    name = forms.CharField(required=False)
    image = forms.CharField(required=False)
    gpu_names = TextFormatField(names_from_text)
    gpus_per_replica = forms.CharField(required=False)
    replicas = forms.CharField(required=False)
    entrypoint = forms.CharField(required=False)
    args = TextFormatField(args_from_shell_words)
    env = TextFormatField(env_from_lines)
    disk_gb = forms.CharField(required=False)
    duration_hours = forms.CharField(required=False)
    service_port = forms.CharField(required=False)

    def serializer_data(self) -> dict[str, Any]:
        return {
            name: value
            for name, value in self.cleaned_data.items()
            if not (name in OPTIONAL and value == "")
        }

    def spec(self) -> ClusterSpec:
        return ClusterSpec(**self.validated())


class ClusterUpdateForm(SerializerForm):
    """What a running cluster's replicas run, changed from its page: only the fields the
    renter changed go to ``cluster_update`` (the form shows the current values)."""

    serializer_class = ClusterInputSerializer
    partial = True

    image = forms.CharField(required=False)
    entrypoint = forms.CharField(required=False)
    args = TextFormatField(args_from_shell_words)
    env = TextFormatField(env_from_lines)

    def serializer_data(self) -> dict[str, Any]:
        return {name: value for name, value in self.cleaned_data.items() if name in self.data}

    def changes(self) -> dict[str, Any]:
        return dict(self.validated())
