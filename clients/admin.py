"""API clients and their keys in the admin.

A client's webhook URL and permissions are editable; its webhook secret changes only by
rotation (an action webhooks/admin.py adds to this page). Keys are issued here (the plain key
is shown once, in the page's message) and revoked here (a revoked key is refused from the next
request on: authentication reads the table every time). The library's own `APIKey` model is
unrelated to clients and its keys never authenticate, so its admin page is removed.
"""

from django.contrib import admin, messages
from django.db import models
from rest_framework_api_key.admin import APIKeyModelAdmin
from rest_framework_api_key.models import APIKey

from clients.models import Client, ClientAPIKey

admin.site.unregister(APIKey)


@admin.register(Client)
class ClientAdmin(admin.ModelAdmin):
    list_display = ("name", "is_operator", "may_send_critical", "webhook_url", "created_at")
    list_filter = ("is_operator", "may_send_critical")
    search_fields = ("name",)
    fields = (
        "name",
        "is_operator",
        "may_send_critical",
        "webhook_url",
        "webhook_secret",
        "previous_webhook_secret_expires_at",
        "created_at",
    )
    readonly_fields = ("webhook_secret", "previous_webhook_secret_expires_at", "created_at")
    # A webhook URL typed without a scheme means https (Django 6's default, chosen now).
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}


@admin.register(ClientAPIKey)
class ClientAPIKeyAdmin(APIKeyModelAdmin):
    """Issue a key: add one, choose its client; the key is shown once after saving.
    Revoke: tick `revoked` on the key, or the action on the list."""

    list_display = ("prefix", "name", "client", "created", "expiry_date", "_has_expired", "revoked")
    list_filter = ("client", "revoked", "created")
    search_fields = ("name", "prefix", "client__name")
    list_select_related = ("client",)
    fields = ("client", "name", "prefix", "expiry_date", "revoked")
    actions = ["revoke_selected"]

    def get_readonly_fields(self, request, obj=None):
        readonly = super().get_readonly_fields(request, obj)
        # A key never moves to another client.
        return (*readonly, "client") if obj is not None else readonly

    @admin.action(
        description="Revoke selected keys (refused from the next request on)",
        permissions=["change"],
    )
    def revoke_selected(self, request, queryset):
        revoked = 0
        for key in queryset.filter(revoked=False):
            key.revoked = True
            key.save(update_fields=["revoked"])
            self.log_change(request, key, "Revoked.")
            revoked += 1
        self.message_user(request, f"Revoked {revoked} key(s).", messages.SUCCESS)
