"""Operators' view of instances: read only. Every change of state goes through the scheduler's
services (instance_transition), never through a form that writes the row."""

from __future__ import annotations

from django.contrib import admin

from scheduler.models import Instance, InstanceEvent


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class InstanceEventInline(admin.TabularInline):
    model = InstanceEvent
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "from_state", "to_state", "reason"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Instance)
class InstanceAdmin(ReadOnlyAdmin):
    list_display = [
        "id", "team", "state", "machine", "gpu_count", "image", "launch_mode", "created_at",
        "state_changed_at",
    ]  # fmt: skip
    list_filter = ["state", "launch_mode"]
    search_fields = ["=id", "uuid", "image", "label", "team__name", "machine__name"]
    list_select_related = ["team", "machine"]
    # The renter's environment and registry login are theirs (secrets, tokens): not shown.
    exclude = ["env", "registry_credential", "jupyter_token", "lease_token"]
    inlines = [InstanceEventInline]
