"""Operators see every webhook event and its attempts, read-only, and may redeliver them; on
a client's page they may rotate its webhook secret."""

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from clients.admin import ClientAdmin
from clients.models import Client
from monitoring.paginators import EstimatedCountPaginator
from notifications.admin import notification_inline_add
from notifyqueue.admin import NoAddOrChange, ReadOnlyInline
from webhooks import services
from webhooks.models import WebhookDeliveryAttempt, WebhookEvent

ATTEMPT_FIELDS = (
    "number",
    "started_at",
    "finished_at",
    "outcome",
    "status_code",
    "duration_ms",
    "error",
    "url",
)


class WebhookDeliveryAttemptInline(NoAddOrChange, admin.TabularInline):
    model = WebhookDeliveryAttempt
    fields = ATTEMPT_FIELDS
    readonly_fields = ATTEMPT_FIELDS
    ordering = ("number",)
    extra = 0
    can_delete = False


NOTIFICATION_EVENT_FIELDS = (
    "event_link",
    "status",
    "state",
    "delivery_attempts",
    "last_status_code",
    "last_error",
    "next_attempt_at",
    "delivered_at",
)


class WebhookEventInline(ReadOnlyInline):
    """A notification's webhook events, on its admin page."""

    model = WebhookEvent
    fields = NOTIFICATION_EVENT_FIELDS
    readonly_fields = NOTIFICATION_EVENT_FIELDS
    ordering = ("created_at",)
    verbose_name_plural = "webhook events"

    @admin.display(description="event")
    def event_link(self, event: WebhookEvent) -> str:
        url = reverse("admin:webhooks_webhookevent_change", args=[event.pk])
        return format_html('<a href="{}">{}</a>', url, event.pk)


notification_inline_add(WebhookEventInline)


@admin.register(WebhookEvent)
class WebhookEventAdmin(NoAddOrChange, admin.ModelAdmin):
    # Events change only through the sender and the redeliver action.
    list_display = (
        "id",
        "client",
        "notification_id",
        "status",
        "state",
        "delivery_attempts",
        "last_status_code",
        "next_attempt_at",
        "delivered_at",
    )
    list_filter = ("state", "status", "client")
    list_select_related = ("client",)
    search_fields = ("=notification__id", "=id")
    search_help_text = "An exact notification id or event id."
    # Built for millions of events: no full count, no date hierarchy (a scan of every event
    # for its dates), the status filter's choices known rather than read from the table, and
    # the order and the client and FAILED filters served by indexes (webhook_event_recent,
    # webhook_event_client_recent, webhook_event_failed).
    ordering = ("-created_at", "-id")
    sortable_by = ()  # a column's sort would read every event
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    readonly_fields = (
        "id",
        "client",
        "notification",
        "status",
        "attempt_count",
        "occurred_at",
        "state",
        "delivery_attempts",
        "redeliveries",
        "next_attempt_at",
        "claim_token",
        "claim_expires_at",
        "last_status_code",
        "last_error",
        "delivered_at",
        "created_at",
    )
    inlines = [WebhookDeliveryAttemptInline]
    actions = ["redeliver_selected"]

    def has_redeliver_permission(self, request) -> bool:
        return request.user.has_perm("webhooks.redeliver_webhookevent")

    @admin.action(
        description="Redeliver selected events (delivered or failed)", permissions=["redeliver"]
    )
    def redeliver_selected(self, request, queryset):
        selected = list(queryset.values_list("id", flat=True))
        queued = set(services.webhook_events_redeliver(event_ids=selected))
        for event in queryset.filter(id__in=queued):
            self.log_change(request, event, "Queued for redelivery with a fresh set of attempts.")
        skipped = len(selected) - len(queued)
        self.message_user(
            request,
            f"{len(queued)} event(s) queued for redelivery; "
            f"{skipped} skipped (still pending or being delivered).",
            messages.SUCCESS if queued else messages.WARNING,
        )


# The secret signs webhooks, so rotating it is this app's action; clients sits below webhooks
# (docs/technical-design.md, Layers), so the action joins the client page from here.
admin.site.unregister(Client)


@admin.register(Client)
class ClientWebhookAdmin(ClientAdmin):
    actions = ["rotate_webhook_secret_selected"]

    @admin.action(
        description="Rotate webhook secret (the old one keeps signing for 24 hours)",
        permissions=["change"],
    )
    def rotate_webhook_secret_selected(self, request, queryset):
        rotated = 0
        for client in queryset:
            if services.client_webhook_secret_rotate(client_id=client.id):
                rotated += 1
                self.log_change(request, client, "Rotated the webhook secret.")
        self.message_user(
            request,
            f"Rotated the webhook secret of {rotated} client(s); webhooks are signed with the "
            "old and the new secret for the next 24 hours.",
            messages.SUCCESS,
        )
