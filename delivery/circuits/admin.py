"""Circuit breakers in the admin: read-only; only the workers change them."""

from django.contrib import admin

from delivery.circuits.models import CircuitBreaker


@admin.register(CircuitBreaker)
class CircuitBreakerAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "consecutive_failures", "opened_at", "updated_at")
    list_filter = ("state",)
    ordering = ("name",)
    readonly_fields = (
        "name",
        "state",
        "consecutive_failures",
        "opened_at",
        "probe_token",
        "probe_expires_at",
        "updated_at",
    )

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
