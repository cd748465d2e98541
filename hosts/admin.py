"""Operators' view of machines: figures, events, benchmarks, and the verified mark they can
revoke or restore by hand, always with a reason (it goes on the machine's page and events)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.shortcuts import render

from hosts.models import (
    BenchmarkRun,
    Gpu,
    HeartbeatSample,
    Machine,
    MachineEvent,
    MaintenanceWindow,
    ReliabilityRecord,
)
from hosts.verification.services import machine_verification_set_by_operator


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
    actions = ["revoke_verified", "restore_verified"]
    # Keys, status and probed or measured figures come from the machine itself: editing them
    # here would bypass the pinning, probing and benchmarks that make them trustworthy.
    readonly_fields = [
        "host_key_type", "host_key", "host_key_fingerprint", "offered_key_type", "offered_key",
        "offered_key_fingerprint", "status", "status_detail", "cpu_cores", "ram_mb",
        "disk_free_gb", "docker_version", "nvidia_runtime", "driver_version", "cuda_version",
        "os_name", "reliability", "last_heartbeat_at", "heartbeat_misses", "probed_at",
        "self_test_at", "self_test_passed", "self_test_report", "created_at", "verified",
        "verification_detail", "verified_changed_at", "verification_override", "bench_at",
        "bench_gpu_simulated", "compute_cap", "tflops_per_gpu", "gpu_mem_bw", "dlperf_per_gpu",
        "disk_write_mbps", "disk_read_mbps", "inet_up", "inet_down", "docker_start_ms",
    ]  # fmt: skip

    @admin.action(description="Revoke the verified mark (with a reason)")
    def revoke_verified(self, request, queryset):
        return self._set_verified(request, queryset, verified=False)

    @admin.action(description="Restore the verified mark (with a reason)")
    def restore_verified(self, request, queryset):
        return self._set_verified(request, queryset, verified=True)

    def _set_verified(self, request, queryset, *, verified: bool):
        """Through the verification service (its reason on the page and in the events, the
        offers refreshed); a page asks for the reason first, and nothing changes without one."""
        reason = request.POST.get("reason", "").strip()
        if not reason:
            return render(
                request,
                "admin/hosts/verification_reason.html",
                {
                    "machines": queryset,
                    "action": request.POST.get("action"),
                    "verb": "Restore" if verified else "Revoke",
                    "opts": self.model._meta,
                    "missing": "apply" in request.POST,
                },
            )
        for machine in queryset:
            machine_verification_set_by_operator(
                machine_id=machine.pk,
                verified=verified,
                reason=reason,
                operator=request.user.get_username(),
            )
        done = "restored" if verified else "revoked"
        self.message_user(
            request, f"Verification {done} on {queryset.count()} machine(s).", messages.SUCCESS
        )
        return None


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(admin.ModelAdmin):
    list_display = ["measured_at", "machine", "passed", "gpu_simulated", "dlperf_per_gpu", "reason"]
    list_filter = ["passed", "gpu_simulated"]
    list_select_related = ["machine"]
    readonly_fields = [f.name for f in BenchmarkRun._meta.fields]


@admin.register(ReliabilityRecord)
class ReliabilityRecordAdmin(admin.ModelAdmin):
    list_display = ["recorded_at", "machine", "reliability", "rented_seconds", "runnable_seconds"]
    list_select_related = ["machine"]
    readonly_fields = [f.name for f in ReliabilityRecord._meta.fields]


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
