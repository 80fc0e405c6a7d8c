"""The API's shapes: what a request may contain and how a notification is shown.

Input serializers check types, formats and combinations of fields and produce service inputs;
the rules that need state (idempotency, backlog, body size after rendering) live in services.
"""

from __future__ import annotations

import functools
import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from notifications.listing import PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX
from notifications.models import HeldReason, Status
from notifications.repositories import ListFilters
from notifications.services import NotificationRequest, idempotency_key_problem
from notifyqueue.serializers import (
    CURSOR_MAX_LENGTH,
    NOT_PLAIN,
    ErrorDetail,
    PlainValidator,
    RejectUnknownFieldsMixin,
    TextField,
)
from notifyqueue.vocabulary import (
    EMAIL_MAX_LENGTH,
    HEADER_BREAKS,
    LONE_SURROGATE,
    MAX_BODY_BYTES,
    RECIPIENT_MAX_LENGTH,
    USER_ID_MAX_LENGTH,
    Channel,
    Priority,
    recipient_problem,
)
from templates.models import EVENT_MAX_LENGTH, SUBJECT_MAX_LENGTH

# The bounds of every request field (docs/security.md lists them all).
# 10 years: far enough for any schedule, near enough that the date arithmetic cannot overflow.
DELAY_SECONDS_MAX = 10 * 366 * 24 * 3600
# A send_at before this is refused rather than read as "now": far-past years overflow when
# moved to UTC, and no client means them.
SEND_AT_MIN = datetime(1970, 1, 1, tzinfo=UTC)
# A time to live counts from the send time: at most a year.
TTL_SECONDS_MAX = 366 * 24 * 3600
# An expires_at may lie up to a year past the latest send time (10 years ahead): as far as a
# send_at plus the longest time to live, and far enough from year 9999 that no date overflows.
EXPIRES_AT_MAX_AHEAD_S = DELAY_SECONDS_MAX + TTL_SECONDS_MAX
# A digest's window: at most a week (a daily digest is `digest_at`).
DIGEST_WINDOW_SECONDS_MAX = 7 * 24 * 3600
DIGEST_AT = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]")
METADATA_MAX_BYTES = 16 * 1024
PAYLOAD_MAX_BYTES = 64 * 1024
JSON_FIELD_MAX_DEPTH = 8
_SURROGATE_MESSAGE = "Text must be valid Unicode: no lone surrogates (\\ud800-\\udfff)."


class CaseInsensitiveChoiceField(serializers.ChoiceField):
    """Accepts any letter case and returns the choice as written in the contract."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.by_folded = {str(choice).casefold(): choice for choice in self.choices}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str):
            data = self.by_folded.get(data.casefold(), data)
        return super().to_internal_value(data)

    def plain_value(self, data: Any) -> Any:
        """`run_validation(data)` for text naming a choice; NOT_PLAIN otherwise."""
        if type(data) is not str:
            return NOT_PLAIN
        return self.by_folded.get(data.casefold(), NOT_PLAIN)


@extend_schema_field({"type": "string", "enum": Priority.names})
class PriorityField(CaseInsensitiveChoiceField):
    """A priority name on the wire, a `Priority` inside."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=Priority.names, **kwargs)

    def to_internal_value(self, data: Any) -> Priority:
        return Priority[super().to_internal_value(data)]

    def plain_value(self, data: Any) -> Any:
        name = super().plain_value(data)
        return NOT_PLAIN if name is NOT_PLAIN else Priority[name]

    def to_representation(self, value: Any) -> str:
        return Priority(value).name


@extend_schema_field(OpenApiTypes.DATETIME)
class OffsetDateTimeField(serializers.Field):
    """An RFC 3339 date-time that must carry `Z` or an offset; naive times are refused."""

    default_error_messages = {
        "invalid": "Expected an RFC 3339 date-time such as 2026-12-01T12:00:00Z.",
        "naive": "The date-time needs a UTC offset, such as Z or +02:00.",
        "range": "Between 1970-01-01T00:00:00Z and {max_ahead_days} days from now.",
    }

    def __init__(self, *, max_ahead_seconds: int = DELAY_SECONDS_MAX, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_ahead_seconds = max_ahead_seconds

    def to_internal_value(self, data: Any):
        try:
            parsed = parse_datetime(data) if isinstance(data, str) else None
        except ValueError:
            parsed = None
        if parsed is None:
            self.fail("invalid")
        if parsed.tzinfo is None:
            self.fail("naive")
        try:
            in_utc = parsed.astimezone(UTC)
        except OverflowError:
            in_utc = None
        latest = timezone.now() + timedelta(seconds=self.max_ahead_seconds)
        if in_utc is None or not SEND_AT_MIN <= in_utc <= latest:
            self.fail("range", max_ahead_days=self.max_ahead_seconds // 86400)
        return parsed

    def plain_value(self, data: Any) -> Any:
        """`run_validation(data)` for a date-time the field accepts; NOT_PLAIN otherwise."""
        if type(data) is not str:
            return NOT_PLAIN
        try:
            return self.to_internal_value(data)
        except serializers.ValidationError:
            return NOT_PLAIN


@extend_schema_field({"type": "object", "additionalProperties": True})
class BoundedJSONObjectField(serializers.DictField):
    """A JSON object of at most `max_bytes` (compact UTF-8 JSON) and `max_depth` levels."""

    default_error_messages = {
        "too_large": "At most {max_bytes} bytes as compact JSON (this one is {size}).",
        "too_deep": "At most {max_depth} levels of nesting.",
        "unstorable": "{problem}",
    }

    def __init__(self, *, max_bytes: int, max_depth: int = JSON_FIELD_MAX_DEPTH, **kwargs):
        super().__init__(**kwargs)
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        if json_depth(value) > self.max_depth:
            self.fail("too_deep", max_depth=self.max_depth)
        problem = json_unstorable(value)
        if problem is not None:
            self.fail("unstorable", problem=problem)
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        if size > self.max_bytes:
            self.fail("too_large", max_bytes=self.max_bytes, size=size)
        return value

    def plain_value(self, data: Any) -> Any:
        """`run_validation(data)` for an object within the bounds; NOT_PLAIN otherwise."""
        if type(data) is not dict or json_depth(data) > self.max_depth:
            return NOT_PLAIN
        if json_unstorable(data) is not None:
            return NOT_PLAIN
        size = len(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode())
        return NOT_PLAIN if size > self.max_bytes else data


def json_depth(value: Any) -> int:
    """Levels of objects and lists: 0 for a scalar, 1 for a flat object. Iterative."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in item)
    return deepest


def json_unstorable(value: Any) -> str | None:
    """Why PostgreSQL's jsonb (or UTF-8) cannot hold `value`, or None when it can: a lone
    surrogate in a key or a string (a `\\ud800` escape decodes to one; it has no UTF-8), or a
    number that is not finite (NaN, Infinity, or a literal such as 1e999 that overflows a
    float). Iterative; call it on a value already bounded in depth."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not key.isascii() and LONE_SURROGATE.search(key):
                    return _SURROGATE_MESSAGE
                pending.append(child)
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            if not item.isascii() and LONE_SURROGATE.search(item):
                return _SURROGATE_MESSAGE
        elif isinstance(item, float) and not math.isfinite(item):
            return "Numbers must be finite: no NaN, Infinity or values past 1.8e308."
    return None


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer; unlike DRF's IntegerField, "5" and 5.0 are refused."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)

    def plain_value(self, data: Any) -> Any:
        """`run_validation(data)` for an integer within the bounds; NOT_PLAIN otherwise."""
        if type(data) is not int:
            return NOT_PLAIN
        if self.min_value is not None and data < self.min_value:
            return NOT_PLAIN
        if self.max_value is not None and data > self.max_value:
            return NOT_PLAIN
        return data


def validate_idempotency_key(value: str) -> str:
    problem = idempotency_key_problem(value)
    if problem:
        raise serializers.ValidationError(problem)
    return value


def validate_digest_at(value: str) -> str:
    if DIGEST_AT.fullmatch(value) is None:
        raise serializers.ValidationError("A time of day as HH:MM, from 00:00 to 23:59.")
    return value


class NotificationCreateInput(RejectUnknownFieldsMixin, serializers.Serializer):
    channel = CaseInsensitiveChoiceField(choices=Channel.values, required=False)
    recipient = TextField(
        required=False,
        max_length=RECIPIENT_MAX_LENGTH,
        help_text=f"email: an address of at most {EMAIL_MAX_LENGTH} characters; sms: E.164 "
        f"(+ and 7 to 15 digits); push: a device token of 8 to {RECIPIENT_MAX_LENGTH} "
        f"printable characters; in_app: your user id, 1 to {USER_ID_MAX_LENGTH} characters.",
    )
    subject = TextField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=SUBJECT_MAX_LENGTH,
        help_text=f"At most {SUBJECT_MAX_LENGTH} characters; for email one line (no control "
        "character but tab, no line separator).",
    )
    body = TextField(
        required=False,
        trim_whitespace=False,
        max_length=MAX_BODY_BYTES,
        help_text=f"At most {MAX_BODY_BYTES} bytes of UTF-8.",
    )
    priority = PriorityField(
        required=False,
        help_text="Case-insensitive on input. Orders your own notifications: CRITICAL goes "
        "before everyone's (it needs your client's permission); the others never pass another "
        "client's, because clients with something due take turns. A NORMAL or LOW "
        "notification that has waited past its due time moves up one level per "
        "NOTIFYQUEUE_PRIORITY_AGING_SECONDS (never above HIGH).",
    )
    send_at = OffsetDateTimeField(
        required=False,
        help_text="RFC 3339 with an offset; a time in the past means now. From "
        "1970-01-01T00:00:00Z to 10 years ahead.",
    )
    delay_seconds = StrictIntegerField(
        required=False,
        min_value=0,
        max_value=DELAY_SECONDS_MAX,
        help_text=f"0 to {DELAY_SECONDS_MAX} (10 years). Not with send_at.",
    )
    metadata = BoundedJSONObjectField(
        required=False,
        max_bytes=METADATA_MAX_BYTES,
        help_text=f"Any JSON object of at most {METADATA_MAX_BYTES} bytes and "
        f"{JSON_FIELD_MAX_DEPTH} levels; echoed back.",
    )
    template = TextField(
        required=False,
        max_length=EVENT_MAX_LENGTH,
        help_text="An event name (at most 255 characters): renders your template for "
        "(event, channel) with `payload`.",
    )
    payload = BoundedJSONObjectField(
        required=False,
        max_bytes=PAYLOAD_MAX_BYTES,
        help_text=f"Fills the template's slots. At most {PAYLOAD_MAX_BYTES} bytes and "
        f"{JSON_FIELD_MAX_DEPTH} levels.",
    )
    user_id = TextField(
        required=False,
        max_length=USER_ID_MAX_LENGTH,
        help_text="Preference mode (with template and payload, without channel and "
        "recipient): the user's preferences choose the channel, its address and fallbacks.",
    )
    expires_at = OffsetDateTimeField(
        required=False,
        max_ahead_seconds=EXPIRES_AT_MAX_AHEAD_S,
        help_text="RFC 3339 with an offset: not sent by then (the database's clock), it ends "
        "EXPIRED and is never sent. Later than the send time (else 400); at most 11 years "
        "ahead. Not with ttl_seconds.",
    )
    ttl_seconds = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=TTL_SECONDS_MAX,
        help_text=f"1 to {TTL_SECONDS_MAX} (366 days), counted from the send time: expires_at "
        "is the send time plus this. Not with expires_at.",
    )
    cancellation_key = TextField(
        required=False,
        trim_whitespace=False,
        error_messages={"blank": idempotency_key_problem("")},
        validators=[validate_idempotency_key],
        help_text="1-255 printable ASCII characters, your own: POST "
        "/api/v1/notifications/cancel with it cancels every notification of yours that "
        "carries it and whose send has not started.",
    )

    digest_key = TextField(
        required=False,
        trim_whitespace=False,
        error_messages={"blank": idempotency_key_problem("")},
        validators=[validate_idempotency_key],
        help_text="1-255 printable ASCII characters, your own; with a template, and with "
        "digest_window_seconds or digest_at. Your notifications with the same channel, "
        "recipient (the user, in preference mode) and digest key inside one window become one "
        "notification: the first of a window goes at once, the others wait (PENDING, "
        "`held_reason` `digest`) and end DIGESTED, carried by the digest the window's close "
        "creates from the (event, channel) template, whose `{digest_count}` and "
        "`{digest_items}` slots it fills. Not with send_at or delay_seconds.",
    )
    digest_window_seconds = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=DIGEST_WINDOW_SECONDS_MAX,
        help_text=f"1 to {DIGEST_WINDOW_SECONDS_MAX} (7 days): the window opened by the first "
        "notification with this digest key lasts this long. Not with digest_at.",
    )
    digest_at = TextField(
        required=False,
        trim_whitespace=False,
        validators=[validate_digest_at],
        help_text="HH:MM (00:00 to 23:59): the window opened by the first notification with "
        "this digest key closes at the next such time of day in the user's time zone (UTC for "
        "a direct recipient). Not with digest_window_seconds.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        errors = create_rules_broken(attrs)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


# The same addresses come back (a batch to one user, a user's every notification): the check
# (Django's EmailValidator for email) is a pure function of its two strings.
_recipient_problem = functools.lru_cache(maxsize=4096)(recipient_problem)


def create_rules_broken(attrs: dict[str, Any]) -> dict[str, list[str]]:
    """The rules between a create's fields, on its values once each field is valid: the
    offending fields with their messages, empty when the combination is valid. Shared by
    `NotificationCreateInput` and `CREATE_PLAIN`."""
    errors: dict[str, list[str]] = {}
    if "send_at" in attrs and "delay_seconds" in attrs:
        errors["delay_seconds"] = ["Give send_at or delay_seconds, not both."]
    if "expires_at" in attrs and "ttl_seconds" in attrs:
        errors["ttl_seconds"] = ["Give expires_at or ttl_seconds, not both."]
    elif "expires_at" in attrs and "send_at" in attrs and attrs["expires_at"] <= attrs["send_at"]:
        errors["expires_at"] = ["Must be later than send_at."]
    _digest_rules_broken(attrs, errors)
    if "template" in attrs:
        for name in ("subject", "body"):
            if name in attrs:
                errors[name] = [f"Give {name} directly or a template, not both."]
    elif "body" not in attrs:
        errors["body"] = ["A body (or a template) is required."]
    if "payload" in attrs and "template" not in attrs:
        errors["payload"] = ["A payload only fills a template."]
    # Preference mode (channel and address from the user's preferences) names neither.
    preference_mode = (
        "template" in attrs
        and "user_id" in attrs
        and "channel" not in attrs
        and "recipient" not in attrs
    )
    if not preference_mode:
        for name in ("channel", "recipient"):
            if name not in attrs:
                errors[name] = ["This field is required."]
        # A user id means "as this user's preferences allow", which direct addressing
        # would bypass; the worker re-checks every notification that names a user.
        if "user_id" in attrs and "template" in attrs:
            errors["user_id"] = ["Preference mode takes no channel or recipient."]
        elif "user_id" in attrs:
            errors["user_id"] = ["Preference mode needs a template and payload."]
    if "channel" in attrs and "recipient" in attrs:
        problem = _recipient_problem(attrs["channel"], attrs["recipient"])
        if problem:
            errors["recipient"] = [problem]
    # An email subject becomes a mail header: a line break would inject headers.
    if attrs.get("channel") == Channel.EMAIL and HEADER_BREAKS.search(attrs.get("subject", "")):
        errors["subject"] = [
            "An email subject is one line: no control character but tab, no line separator."
        ]
    return errors


def _digest_rules_broken(attrs: dict[str, Any], errors: dict[str, list[str]]) -> None:
    """A digest key needs a template and one way of closing its window, and no send time."""
    window = "digest_window_seconds" in attrs
    at = "digest_at" in attrs
    if "digest_key" not in attrs:
        for name in ("digest_window_seconds", "digest_at"):
            if name in attrs:
                errors[name] = ["Only with a digest_key."]
        return
    if window and at:
        errors["digest_at"] = ["Give digest_window_seconds or digest_at, not both."]
    elif not window and not at:
        errors["digest_key"] = ["A digest key needs digest_window_seconds or digest_at."]
    if "template" not in attrs:
        errors["digest_key"] = ["A digest is rendered from a template: give template and payload."]
    for name in ("send_at", "delay_seconds"):
        if name in attrs:
            errors[name] = ["A digest's first notification goes at once: not with a digest_key."]


def notification_request(data: dict[str, Any]) -> NotificationRequest:
    """The service input for validated create data (`NotificationCreateInput`)."""
    return NotificationRequest(
        channel=data.get("channel"),
        recipient=data.get("recipient"),
        subject=data.get("subject", ""),
        body=data.get("body"),
        priority=data.get("priority", Priority.NORMAL),
        send_at=data.get("send_at"),
        delay_seconds=data.get("delay_seconds"),
        metadata=data.get("metadata", {}),
        template=data.get("template"),
        payload=data.get("payload"),
        user_id=data.get("user_id"),
        expires_at=data.get("expires_at"),
        ttl_seconds=data.get("ttl_seconds"),
        cancellation_key=data.get("cancellation_key"),
        digest_key=data.get("digest_key"),
        digest_window_seconds=data.get("digest_window_seconds"),
        digest_at=data.get("digest_at"),
    )


class BatchItemInput(NotificationCreateInput):
    idempotency_key = TextField(
        trim_whitespace=False,
        # Not allow_blank: DRF answers a blank value before running the validators.
        error_messages={"blank": idempotency_key_problem("")},
        validators=[validate_idempotency_key],
        help_text="1-255 printable characters, scoped to your client.",
    )


# The create's fields checked by their own declarations above, without DRF's machinery: the
# thin create path (notifications/ingest.py) takes the requests these accept, and the views
# try them before the serializer.
CREATE_PLAIN = PlainValidator(NotificationCreateInput, rules=create_rules_broken)
BATCH_ITEM_PLAIN = PlainValidator(BatchItemInput, rules=create_rules_broken)


class CancelByKeyInput(RejectUnknownFieldsMixin, serializers.Serializer):
    cancellation_key = TextField(
        trim_whitespace=False,
        error_messages={"blank": idempotency_key_problem("")},
        validators=[validate_idempotency_key],
        help_text="The cancellation_key your notifications were created with.",
    )


class CancelByKeyOutput(serializers.Serializer):
    cancelled = serializers.IntegerField(
        help_text="How many notifications this call cancelled (all now CANCELLED); those "
        "whose send had already started are not counted and finish as they would have."
    )


class BatchInput(RejectUnknownFieldsMixin, serializers.Serializer):
    notifications = serializers.ListField(
        child=serializers.JSONField(), min_length=1, max_length=1000
    )


class NotificationListFilters(RejectUnknownFieldsMixin, serializers.Serializer):
    status = CaseInsensitiveChoiceField(choices=Status.values, required=False)
    channel = CaseInsensitiveChoiceField(choices=Channel.values, required=False)
    recipient = TextField(required=False, max_length=RECIPIENT_MAX_LENGTH)
    priority = PriorityField(required=False)
    cursor = serializers.CharField(
        required=False, max_length=CURSOR_MAX_LENGTH, help_text="From `next` or `previous`."
    )
    page_size = serializers.IntegerField(
        required=False, min_value=1, max_value=PAGE_SIZE_MAX, default=PAGE_SIZE_DEFAULT
    )

    def to_filters(self) -> ListFilters:
        data = self.validated_data
        return ListFilters(
            status=data.get("status"),
            channel=data.get("channel"),
            recipient=data.get("recipient"),
            priority=data.get("priority"),
        )


class BulkRetryInput(RejectUnknownFieldsMixin, serializers.Serializer):
    status = CaseInsensitiveChoiceField(
        choices=[Status.DEAD_LETTERED, Status.FAILED],
        help_text="Which notifications to send back: the dead-letter queue or permanent failures.",
    )
    channel = CaseInsensitiveChoiceField(
        choices=Channel.values, required=False, help_text="Only this channel's notifications."
    )


class BulkRetryOutput(serializers.Serializer):
    retried = serializers.IntegerField(
        help_text="Sent back to PENDING by this call (at most 1,000)."
    )
    remaining = serializers.IntegerField(
        help_text="Still in that status (and channel); repeat the call until this is 0."
    )


RECEIPT_TYPES = ("delivered", "bounced", "complained", "opted_out", "failed")


class NotificationOutput(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=Status.values)
    channel = serializers.ChoiceField(choices=Channel.values)
    recipient = serializers.CharField()
    priority = PriorityField()
    send_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    attempt_count = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    last_error = serializers.CharField(allow_null=True)
    sent_at = serializers.DateTimeField(allow_null=True)
    idempotency_key = serializers.CharField()
    metadata = serializers.DictField()
    user_id = serializers.CharField(allow_null=True)
    template = serializers.CharField(allow_null=True)
    fallback_channels = serializers.ListField(child=serializers.CharField())
    operator_retries = serializers.IntegerField()
    expires_at = serializers.DateTimeField(
        allow_null=True,
        help_text="Not sent by then (the database's clock), it ends EXPIRED. Null: no expiry.",
    )
    cancellation_key = serializers.CharField(
        allow_null=True, help_text="The key POST /api/v1/notifications/cancel takes. Null: none."
    )
    held_until = serializers.DateTimeField(
        allow_null=True,
        help_text=(
            "A PENDING notification held back: when it is next due (its recipient's next free "
            "rate-limit slot, its provider's probe time while the provider's circuit is open, "
            "the end of its user's quiet hours in the user's time zone, or its digest "
            "bucket's close). Null otherwise."
        ),
    )
    held_reason = serializers.ChoiceField(
        choices=HeldReason.values,
        allow_null=True,
        help_text=(
            "Why it is held: `rate_limit` (its recipient's rate limit), `circuit_open` (its "
            "provider is failing; no attempt is used while it waits, for at most "
            "NOTIFYQUEUE_CIRCUIT_MAX_HOLD_SECONDS, after which it is DEAD_LETTERED) or "
            "`quiet_hours` (it fell due inside one of its user's quiet-hours windows; no "
            "attempt is used; it goes at the window's end, and a change of the user's time "
            "zone or windows applies at once) or `digest` (a digest bucket collected it; it "
            "ends DIGESTED when the bucket closes at held_until, or CANCELLED or EXPIRED "
            "before). Null when not held."
        ),
    )
    digest_bucket = serializers.UUIDField(
        source="digest_bucket_id",
        allow_null=True,
        help_text="The digest bucket that collected it (created with a digest_key, not the "
        "first of its window). Null otherwise.",
    )
    digest_id = serializers.UUIDField(
        allow_null=True,
        help_text="A DIGESTED notification's digest: the notification that carried it. Null "
        "otherwise.",
    )
    receipt = serializers.ChoiceField(
        choices=RECEIPT_TYPES,
        allow_null=True,
        help_text=(
            "The provider's latest delivery receipt for a SENT notification (`GET "
            ".../receipts` lists them all); a `bounced` or `complained` is never overwritten. "
            "Null until one arrives. SENT stays the status whatever the receipt says."
        ),
    )


class NotificationListOutput(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = NotificationOutput(many=True)


class BatchResultOutput(serializers.Serializer):
    status = serializers.ChoiceField(choices=[200, 201, 400, 403, 409, 422])
    notification = NotificationOutput(required=False)
    error = ErrorDetail(required=False)


class BatchOutput(serializers.Serializer):
    results = BatchResultOutput(many=True)
