"""Delivery history and live workers in the admin, read-only: attempts are written only by
the worker's claim and finish statements, heartbeats only by the workers themselves."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.contrib import admin
from django.utils import timezone

from delivery.models import DeliveryAttempt, WorkerHeartbeat
from monitoring.paginators import EstimatedCountPaginator
from monitoring.services import worker_live_window_s
from notifications.admin import notification_inline_add
from notifyqueue.admin import ReadOnlyAdmin, ReadOnlyInline

NOTIFICATION_ATTEMPT_FIELDS = (
    "number",
    "channel",
    "worker",
    "started_at",
    "finished_at",
    "outcome",
    "error",
    "provider_message_id",
)


class DeliveryAttemptInline(ReadOnlyInline):
    """A notification's attempts, on its admin page."""

    model = DeliveryAttempt
    fields = NOTIFICATION_ATTEMPT_FIELDS
    readonly_fields = NOTIFICATION_ATTEMPT_FIELDS
    ordering = ("started_at", "id")
    verbose_name_plural = "delivery attempts"


notification_inline_add(DeliveryAttemptInline)


@admin.register(DeliveryAttempt)
class DeliveryAttemptAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "notification",
        "number",
        "channel",
        "worker",
        "started_at",
        "finished_at",
        "outcome",
        "error",
    )
    list_filter = ("outcome", "channel")
    # The primary key's order: the newest attempts first without sorting millions of rows.
    ordering = ("-id",)
    sortable_by = ()
    search_fields = ("=notification__id",)
    search_help_text = "An exact notification id."
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100
    readonly_fields = ("notification", "claim_token", *NOTIFICATION_ATTEMPT_FIELDS)

    def get_search_results(self, request, queryset, search_term):
        """The attempts of one notification (index attempt_by_notif); anything that is not a
        notification id matches nothing."""
        try:
            notification_id = uuid.UUID(search_term.strip())
        except ValueError:
            return (queryset.none(), False) if search_term.strip() else (queryset, False)
        return queryset.filter(notification_id=notification_id), False


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    list_display = (
        "worker_id",
        "alive",
        "hostname",
        "pid",
        "started_at",
        "last_seen_at",
        "stopped_at",
        "delivered",
    )
    ordering = ("-last_seen_at",)
    readonly_fields = list_display[:1] + list_display[2:]

    @admin.display(boolean=True, description="alive")
    def alive(self, heartbeat: WorkerHeartbeat) -> bool:
        """Not stopped, and seen within NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS: the window past
        which its claims are taken over and /status counts it dead."""
        window = timedelta(seconds=worker_live_window_s())
        return heartbeat.stopped_at is None and heartbeat.last_seen_at >= timezone.now() - window
