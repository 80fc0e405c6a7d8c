"""Receipts in the admin, read-only: they are written only by the receipts endpoint and the
statements that apply them. A notification's receipts show on its page (at most one per type
and bounce kind)."""

from __future__ import annotations

from delivery.receipts.models import Receipt
from notifications.admin import notification_inline_add
from notifyqueue.admin import ReadOnlyInline

RECEIPT_FIELDS = ("type", "bounce", "channel", "message_id", "occurred_at", "received_at")


class ReceiptInline(ReadOnlyInline):
    """A notification's delivery receipts, on its admin page."""

    model = Receipt
    fields = RECEIPT_FIELDS
    readonly_fields = RECEIPT_FIELDS
    ordering = ("received_at", "id")
    verbose_name_plural = "delivery receipts"


notification_inline_add(ReceiptInline)
