"""The operator's console: the notification list (the dead-letter queue is one click on the
status filter), each notification with its attempts and webhook events (inlines added by the
delivery and webhooks apps), and the retry and cancel actions.

The actions call the same services as the API (`notification_retry`, `notification_cancel`),
so the rules live in one place; each needs its own permission, reports what changed and why
the rest did not, and leaves a log entry per changed notification. Nothing here edits a
notification directly: status, claim, attempts and timing move only through the queue's
guarded statements, so every field is read-only.

The list is built for a table of millions of rows: no full count (estimated-count paginator,
no "show all" count), filters and the default order served by indexes, clients fetched in
the same query.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter

from django.contrib import admin, messages
from django.db.models import Q
from django.utils import timezone
from django.utils.html import format_html

from monitoring.paginators import EstimatedCountPaginator
from notifications import retries, services
from notifications.models import (
    QUEUED_STATUSES,
    DigestState,
    HeldReason,
    Notification,
    NotificationDigest,
    Status,
    held_reason_of,
    recipient_is,
)
from notifyqueue.admin import ReadOnlyAdmin


def notification_inline_add(inline: type[admin.options.InlineModelAdmin]) -> None:
    """Shows another app's rows on the notification page (delivery's attempts, webhooks'
    events). Those apps sit above notifications (docs/technical-design.md, Layers), so each
    adds its own inline from its admin.py instead of this module importing their models."""
    NotificationAdmin.inlines = [*NotificationAdmin.inlines, inline]


# One admin action changes at most this many rows, one guarded write each; a larger clean-up
# is the bulk endpoint's or the retry_notifications command's job.
ACTION_LIMIT = 1000


class StatusFilter(admin.SimpleListFilter):
    """The status filter, read through the narrow queue table for every status but SENT (the
    wide table has no index on status: see NotificationQueue). Same parameter as Django's
    own field filter, so links to `?status__exact=DEAD_LETTERED` keep working."""

    title = "status"
    parameter_name = "status__exact"

    def lookups(self, request, model_admin):
        return Status.choices

    def queryset(self, request, queryset):
        value = self.value()
        if value in QUEUED_STATUSES:
            return queryset.filter(queue_entry__status=value)
        if value is not None:
            return queryset.filter(status=value)
        return queryset


class HeldFilter(admin.SimpleListFilter):
    """PENDING rows held past their own time, by reason. Each reason's mark has a partial
    index holding only marked rows (notification_rate_held, notification_circuit_held,
    notification_quiet_held), so the filter reads the held rows, not the table."""

    title = "held"
    parameter_name = "held"
    _MARKS = {
        HeldReason.RATE_LIMIT: "rate_deferred_from",
        HeldReason.CIRCUIT_OPEN: "circuit_held_since",
        HeldReason.QUIET_HOURS: "quiet_held_since",
        HeldReason.DIGEST: "digest_bucket_id",
    }

    def lookups(self, request, model_admin):
        return HeldReason.choices

    def queryset(self, request, queryset):
        mark = self._MARKS.get(self.value())
        if mark is None:
            return queryset
        return queryset.filter(**{f"{mark}__isnull": False, "status": Status.PENDING})


class CancellationKeyFilter(admin.SimpleListFilter):
    """The notifications carrying one cancellation key, every client's (an operator follows a
    client's report: `?cancellation_key=<key>`, or the key in the search box), read through
    the record's partial index `notification_cancellation_key`. Shown while a key is chosen."""

    title = "cancellation key"
    parameter_name = "cancellation_key"

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(cancellation_key=value) if value else queryset


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "status",
        "channel",
        "recipient_short",
        "priority_name",
        "client",
        "attempts",
        "operator_retries",
        "due_at",
        "held",
        "created_at",
        "last_error_short",
    )
    list_filter = (
        StatusFilter,
        HeldFilter,
        "channel",
        "priority",
        "client",
        "created_at",
        CancellationKeyFilter,
    )
    list_select_related = ("client",)
    # The order of the indexes notification_recent and notification_client_list, so each
    # filter reads its index in order; filtered by a queued status, the same order read from
    # the queue table's queue_status index (get_ordering).
    ordering = ("-created_at", "-id")
    sortable_by = ("created_at",)
    search_fields = ("=id", "=recipient", "=idempotency_key")
    search_help_text = "An exact notification id, recipient, idempotency key or cancellation key."
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100
    actions = ["retry_selected", "cancel_selected"]
    # Filled by the apps whose rows these are (notification_inline_add).
    inlines = []
    fieldsets = (
        (None, {"fields": ("id", "client", "status", "channel", "recipient", "priority_name")}),
        ("Content", {"fields": ("subject", "body", "metadata", "user_id", "template", "payload")}),
        (
            "Delivery",
            {
                "fields": (
                    "attempt_count",
                    "max_attempts",
                    "last_error_display",
                    "sent_at",
                    "receipt",
                    "send_at",
                    "due_at",
                    "held_reason",
                    "held_until",
                    "expires_at",
                    "fallback_channels",
                )
            },
        ),
        (
            "Operator retries",
            {"fields": ("operator_retries", "last_retried_at", "last_retried_by")},
        ),
        (
            "Claim",
            {"fields": ("claim_token", "claimed_by", "claim_expires_at", "send_started_at")},
        ),
        (
            "Request",
            {
                "fields": (
                    "idempotency_key",
                    "cancellation_key",
                    "request_fingerprint",
                    "created_at",
                    "updated_at",
                )
            },
        ),
    )
    readonly_fields = (
        "id",
        "client",
        "status",
        "channel",
        "recipient",
        "priority_name",
        "subject",
        "body",
        "metadata",
        "user_id",
        "template",
        "payload",
        "attempt_count",
        "max_attempts",
        "last_error_display",
        "sent_at",
        "receipt",
        "send_at",
        "due_at",
        "held_reason",
        "held_until",
        "expires_at",
        "fallback_channels",
        "operator_retries",
        "last_retried_at",
        "last_retried_by",
        "claim_token",
        "claimed_by",
        "claim_expires_at",
        "send_started_at",
        "idempotency_key",
        "cancellation_key",
        "request_fingerprint",
        "created_at",
        "updated_at",
    )

    @admin.display(description="held reason")
    def held_reason(self, obj: Notification) -> str | None:
        """Why a PENDING row waits past its own time, as the API shows it."""
        return held_reason_of(
            status=obj.status,
            rate_deferred_from=obj.rate_deferred_from,
            circuit_held_since=obj.circuit_held_since,
            quiet_held_since=obj.quiet_held_since,
            digest_bucket_id=obj.digest_bucket_id,
        )

    @admin.display(description="held until")
    def held_until(self, obj: Notification):
        reason = self.held_reason(obj)
        if reason == HeldReason.DIGEST:
            return obj.digest_closes_at
        return obj.due_at if reason is not None else None

    @admin.display(description="held")
    def held(self, obj: Notification) -> str:
        """The list's column: why and until when a PENDING row is held; empty if it is not."""
        reason = self.held_reason(obj)
        if reason is None:
            return ""
        return f"{reason} until {timezone.localtime(obj.due_at):%Y-%m-%d %H:%M:%S %Z}"

    # Read-only (ReadOnlyAdmin): the queue's statements are the only writers, and deleting
    # would take the attempts and webhook events with it; rows are the record.

    def has_retry_permission(self, request) -> bool:
        return request.user.has_perm("notifications.retry_notification")

    def has_cancel_permission(self, request) -> bool:
        return request.user.has_perm("notifications.cancel_notification")

    # --- the list ---------------------------------------------------------------------------

    def get_ordering(self, request):
        if request.GET.get(StatusFilter.parameter_name) in QUEUED_STATUSES:
            return ("-queue_entry__created_at", "-id")
        return self.ordering

    def get_search_results(self, request, queryset, search_term):
        """Exact matches only, each served by an index (the primary key, the recipient's digest
        index, the idempotency key's index, the cancellation key's); Django's default `=`
        search compares case-insensitively, which no index serves."""
        term = search_term.strip()
        if not term:
            return queryset, False
        match = recipient_is(term) | Q(idempotency_key=term) | Q(cancellation_key=term)
        with contextlib.suppress(ValueError):
            match |= Q(id=uuid.UUID(term))
        return queryset.filter(match), False

    @admin.display(description="recipient")
    def recipient_short(self, obj: Notification) -> str:
        return obj.recipient if len(obj.recipient) <= 60 else obj.recipient[:57] + "..."

    @admin.display(description="priority")
    def priority_name(self, obj: Notification) -> str:
        return obj.get_priority_display()

    @admin.display(description="attempts")
    def attempts(self, obj: Notification) -> str:
        return f"{obj.attempt_count}/{obj.max_attempts}"

    @admin.display(description="last error")
    def last_error_short(self, obj: Notification) -> str:
        error = obj.last_error or ""
        return error if len(error) <= 80 else error[:77] + "..."

    @admin.display(description="last error")
    def last_error_display(self, obj: Notification) -> str:
        if not obj.last_error:
            return "-"
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.last_error)

    # --- actions ----------------------------------------------------------------------------

    @admin.action(
        description="Retry selected notifications (FAILED or DEAD_LETTERED)",
        permissions=["retry"],
    )
    def retry_selected(self, request, queryset):
        selected = self._selection(request, queryset)
        if selected is None:
            return
        operator = f"admin:{request.user.get_username()}"
        changed, refused = self._apply(
            selected,
            lambda notification_id, _client_id: retries.notification_retry(
                notification_id=notification_id, operator=operator, now=timezone.now()
            ),
            refusal=retries.NotificationNotRetryable,
        )
        self._log_and_report(
            request,
            changed=changed,
            refused=refused,
            verb="Retried",
            log_message="Retried: back to PENDING with a fresh set of attempts.",
            rule="only FAILED or DEAD_LETTERED notifications can be retried",
        )

    @admin.action(
        description="Cancel selected notifications (PENDING only)", permissions=["cancel"]
    )
    def cancel_selected(self, request, queryset):
        selected = self._selection(request, queryset)
        if selected is None:
            return
        changed, refused = self._apply(
            selected,
            # The API's cancel, on behalf of the notification's owner.
            lambda notification_id, client_id: services.notification_cancel(
                notification_id=notification_id, client_id=client_id, now=timezone.now()
            ),
            refusal=services.NotificationNotCancellable,
        )
        self._log_and_report(
            request,
            changed=changed,
            refused=refused,
            verb="Cancelled",
            log_message="Cancelled.",
            rule="only PENDING notifications can be cancelled",
        )

    @staticmethod
    def _apply(selected, change, *, refusal) -> tuple[list[uuid.UUID], Counter]:
        """Calls `change(id, client_id)` on each; counts refusals by the status that caused
        them (and rows gone meanwhile) instead of stopping at the first."""
        changed, refused = [], Counter()
        for notification_id, client_id in selected:
            try:
                change(notification_id, client_id)
            except refusal as exc:
                refused[exc.fields["status"][0]] += 1
            except services.NotificationNotFound:
                refused["gone"] += 1
            else:
                changed.append(notification_id)
        return changed, refused

    def _selection(self, request, queryset) -> list[tuple[uuid.UUID, uuid.UUID]] | None:
        selected = list(queryset.order_by().values_list("id", "client_id")[: ACTION_LIMIT + 1])
        if len(selected) > ACTION_LIMIT:
            self.message_user(
                request,
                f"At most {ACTION_LIMIT} notifications per action; nothing was changed. For "
                "more, use POST /api/v1/notifications/retry or manage.py retry_notifications.",
                messages.ERROR,
            )
            return None
        return selected

    def _log_and_report(self, request, *, changed, refused, verb, log_message, rule) -> None:
        for notification in Notification.objects.filter(id__in=changed):
            self.log_change(request, notification, log_message)
        text = f"{verb} {len(changed)} notification(s)."
        if refused:
            why = ", ".join(f"{count} {status}" for status, count in sorted(refused.items()))
            text += f" Not changed: {why} ({rule})."
        level = messages.SUCCESS if changed and not refused else messages.WARNING
        self.message_user(request, text, level)


class DigestStateFilter(admin.SimpleListFilter):
    """Open buckets (collecting, or being closed) by default: the list an operator wants; the
    closed ones are history."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("open", "Not closed"), *DigestState.choices]

    def queryset(self, request, queryset):
        value = self.value() or "open"
        if value == "open":
            return queryset.filter(state__in=[DigestState.OPEN, DigestState.CLOSING])
        return queryset.filter(state=value)

    def choices(self, changelist):
        value = self.value() or "open"
        for lookup, title in self.lookup_choices:
            yield {
                "selected": value == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


@admin.register(NotificationDigest)
class NotificationDigestAdmin(ReadOnlyAdmin):
    """The digest buckets: which are collecting, how many each holds and when each closes;
    a closed one names its digest. Read-only: a bucket changes only through the creates that
    join it and the worker's close."""

    list_display = (
        "digest_key",
        "client",
        "channel",
        "recipient",
        "user_id",
        "state",
        "collected",
        "opened_at",
        "closes_at",
        "claimed_by",
        "digest_id",
        "digested",
    )
    list_filter = (DigestStateFilter, "channel")
    list_select_related = ("client",)
    search_fields = ("=digest_key",)
    ordering = ("closes_at",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
