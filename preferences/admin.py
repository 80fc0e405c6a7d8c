"""Users' preferences in the admin, read-only: users change them through the API."""

from django.contrib import admin

from notifyqueue.admin import NoAddOrChange
from preferences.models import UserPreferences


@admin.register(UserPreferences)
class UserPreferencesAdmin(NoAddOrChange, admin.ModelAdmin):
    list_display = ("user_id", "client", "channels", "disabled_channels", "updated_at")
    list_filter = ("client",)
    list_select_related = ("client",)
    search_fields = ("=user_id",)
    search_help_text = "An exact user id."
    readonly_fields = (
        "client",
        "user_id",
        "channels",
        "addresses",
        "muted_events",
        "disabled_channels",
        "created_at",
        "updated_at",
    )
