"""API clients in the admin: their webhook URL is editable; secrets change only by rotation."""

from django.contrib import admin, messages
from django.db import models

from clients.models import Client
from webhooks import services as webhook_services


@admin.register(Client)
class ClientAdmin(admin.ModelAdmin):
    list_display = ("name", "is_operator", "webhook_url", "created_at")
    search_fields = ("name",)
    fields = (
        "name",
        "is_operator",
        "webhook_url",
        "webhook_secret",
        "previous_webhook_secret_expires_at",
        "created_at",
    )
    readonly_fields = ("webhook_secret", "previous_webhook_secret_expires_at", "created_at")
    # A webhook URL typed without a scheme means https (Django 6's default, chosen now).
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    actions = ["rotate_webhook_secret_selected"]

    @admin.action(
        description="Rotate webhook secret (the old one keeps signing for 24 hours)",
        permissions=["change"],
    )
    def rotate_webhook_secret_selected(self, request, queryset):
        rotated = 0
        for client in queryset:
            if webhook_services.client_webhook_secret_rotate(client_id=client.id):
                rotated += 1
                self.log_change(request, client, "Rotated the webhook secret.")
        self.message_user(
            request,
            f"Rotated the webhook secret of {rotated} client(s); webhooks are signed with the "
            "old and the new secret for the next 24 hours.",
            messages.SUCCESS,
        )
