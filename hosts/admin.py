"""Operators' view of machines: figures, events, and the verified mark only they can set."""

from __future__ import annotations

from django.contrib import admin, messages

from hosts.models import Gpu, HeartbeatSample, Machine, MachineEvent, MaintenanceWindow


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    can_delete = False
    readonly_fields = ["index", "uuid", "name", "memory_mib", "present"]


class MaintenanceWindowInline(admin.TabularInline):
    model = MaintenanceWindow
    extra = 0


@admin.register(Machine)
class MachineAdmin(admin.ModelAdmin):
    list_display = [
        "name", "team", "address", "port", "status", "listed", "verified", "reliability",
        "last_heartbeat_at", "self_test_passed",
    ]  # fmt: skip
    list_filter = ["status", "listed", "verified", "nvidia_runtime", "location"]
    search_fields = ["name", "address", "team__name", "host_key_fingerprint"]
    list_select_related = ["team"]
    inlines = [GpuInline, MaintenanceWindowInline]
    actions = ["mark_verified", "mark_unverified"]
    # Keys, status and probed figures come from the machine itself: editing them here would
    # bypass the pinning and probing that make them trustworthy.
    readonly_fields = [
        "host_key_type", "host_key", "host_key_fingerprint", "offered_key_type", "offered_key",
        "offered_key_fingerprint", "status", "status_detail", "cpu_cores", "ram_mb",
        "disk_free_gb", "docker_version", "nvidia_runtime", "driver_version", "cuda_version",
        "os_name", "reliability", "last_heartbeat_at", "heartbeat_misses", "probed_at",
        "self_test_at", "self_test_passed", "self_test_report", "created_at",
    ]  # fmt: skip

    @admin.action(description="Mark verified")
    def mark_verified(self, request, queryset) -> None:
        updated = queryset.update(verified=True)
        self.message_user(request, f"{updated} machine(s) marked verified.", messages.SUCCESS)

    @admin.action(description="Remove the verified mark")
    def mark_unverified(self, request, queryset) -> None:
        updated = queryset.update(verified=False)
        self.message_user(request, f"{updated} machine(s) no longer verified.", messages.SUCCESS)


@admin.register(MachineEvent)
class MachineEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "machine", "kind", "message"]
    list_filter = ["kind"]
    search_fields = ["machine__name", "message"]
    list_select_related = ["machine"]
    readonly_fields = ["machine", "kind", "message", "created_at"]


@admin.register(HeartbeatSample)
class HeartbeatSampleAdmin(admin.ModelAdmin):
    list_display = ["created_at", "machine", "ok", "latency_ms", "gpus_rented", "gpus_total"]
    list_filter = ["ok"]
    list_select_related = ["machine"]
    readonly_fields = ["machine", "ok", "latency_ms", "gpus_rented", "gpus_total", "created_at"]
