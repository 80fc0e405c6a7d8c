"""Base classes for admin pages that show what the queue wrote but never edit it.

Rows of the queue change only through its guarded statements (claim, finish, retry, cancel)
and the services that run them, so most admin pages are views, not editors.
"""

from django.contrib import admin


class NoAddOrChange:
    """No add button, no editable form: the page only shows rows."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyAdmin(NoAddOrChange, admin.ModelAdmin):
    """Shows rows; adds, edits and deletes none of them."""

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyInline(NoAddOrChange, admin.TabularInline):
    """A read-only table of related rows on a detail page."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
