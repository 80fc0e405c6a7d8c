"""Circuit breakers in the admin: read-only; only the workers change them."""

from django.contrib import admin

from delivery.circuits.models import CircuitBreaker
from notifyqueue.admin import ReadOnlyAdmin


@admin.register(CircuitBreaker)
class CircuitBreakerAdmin(ReadOnlyAdmin):
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
