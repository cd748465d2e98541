from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from marketplace.models import ApiKey, Deployment, Invitation, Membership, Rental, Team, User


@admin.register(User)
class MarketplaceUserAdmin(UserAdmin):
    # Emails are unique, so the add form must ask for one (two users without one would
    # collide on ""). The new user's personal team comes from the user_created receiver.
    add_fieldsets = (
        (
            None,
            {
                "classes": ("wide",),
                "fields": ("username", "email", "usable_password", "password1", "password2"),
            },
        ),
    )


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "personal", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline]


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ["email", "team", "role", "expires_at", "accepted_at"]
    exclude = ["token_hash"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "team", "access", "audience", "revoked_at", "last_used_at"]
    readonly_fields = ["prefix", "key_hash", "last_used_at"]


class ReadOnlyAdmin(admin.ModelAdmin):
    """Seen by operators, changed only through the services (money and state have rules)."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Rental)
class RentalAdmin(ReadOnlyAdmin):
    list_display = [
        "id", "team", "instance", "machine", "gpu_count", "price_per_gpu_hour", "starts_at",
        "ends_at", "interruptible", "settled_at",
    ]  # fmt: skip
    list_filter = ["interruptible"]
    search_fields = ["=id", "=instance__id", "team__name", "machine__name"]
    list_select_related = ["team", "machine", "instance"]


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdmin):
    list_display = ["id", "name", "team", "mode", "state", "image", "replica_count", "created_at"]
    list_filter = ["mode", "state"]
    search_fields = ["=id", "name", "image", "team__name"]
    list_select_related = ["team"]
    exclude = ["env"]  # the renter's (secrets)
