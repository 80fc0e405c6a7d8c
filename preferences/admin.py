"""Users' preferences in the admin, read-only: users change them through the API.

Built for millions of users: estimated counts, the order of the (client, user id) index, and
the search an exact, case-sensitive user id (index user_preferences_user), as the API names it.
"""

from django.contrib import admin

from monitoring.paginators import EstimatedCountPaginator
from notifyqueue.admin import NoAddOrChange
from preferences.models import UserPreferences


@admin.register(UserPreferences)
class UserPreferencesAdmin(NoAddOrChange, admin.ModelAdmin):
    list_display = (
        "user_id",
        "client",
        "channels",
        "disabled_channels",
        "timezone",
        "quiet_hours",
        "updated_at",
    )
    list_filter = ("client",)
    list_select_related = ("client",)
    search_fields = ("=user_id",)
    search_help_text = "An exact user id."
    ordering = ("client_id", "user_id")
    sortable_by = ()  # a column's sort would read every user
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    readonly_fields = (
        "client",
        "user_id",
        "channels",
        "addresses",
        "muted_events",
        "disabled_channels",
        "timezone",
        "quiet_hours",
        "created_at",
        "updated_at",
    )

    def get_search_results(self, request, queryset, search_term):
        """The preferences of exactly this user id, in every client: user ids are
        case-sensitive (Django's `=` search compares them case-insensitively, which no index
        serves)."""
        term = search_term.strip()
        return (queryset.filter(user_id=term) if term else queryset), False
