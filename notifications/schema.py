"""How the notification endpoints appear in the OpenAPI schema (drf-spectacular): one
`extend_schema` per operation, applied in notifications/views.py, with its examples and
response maps, so that the views hold only HTTP."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema

from notifications.serializers import (
    BatchInput,
    BatchOutput,
    BulkRetryInput,
    BulkRetryOutput,
    CancelByKeyInput,
    CancelByKeyOutput,
    NotificationCreateInput,
    NotificationListFilters,
    NotificationListOutput,
    NotificationOutput,
)
from notifyqueue.errors import error_body
from notifyqueue.serializers import ErrorOutput

IDEMPOTENCY_HEADER = "Idempotency-Key"

NOTIFICATION_ID = OpenApiParameter(
    "notification_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The notification."
)
IDEMPOTENCY_KEY = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=True,
    description=(
        "1-255 printable ASCII characters, scoped to your client. Repeating a request with the "
        "same key returns the original notification (200); reusing it for a different request "
        "answers 409."
    ),
)
EXAMPLE_NOTIFICATION = {
    "id": "3f6c2b0e-8d1a-4c57-9a51-0c4f1d7e2b90",
    "status": "PENDING",
    "channel": "email",
    "recipient": "ada@example.com",
    "priority": "HIGH",
    "send_at": "2026-12-01T12:00:00Z",
    "created_at": "2026-11-30T09:15:02.114Z",
    "updated_at": "2026-11-30T09:15:02.114Z",
    "attempt_count": 0,
    "max_attempts": 6,
    "last_error": None,
    "sent_at": None,
    "idempotency_key": "order-A-17-code",
    "metadata": {"order": "A-17"},
    "user_id": None,
    "template": None,
    "fallback_channels": [],
    "operator_retries": 0,
    "expires_at": None,
    "cancellation_key": None,
    "held_until": None,
    "held_reason": None,
    "receipt": None,
}
EXAMPLE_REQUEST = {
    "channel": "email",
    "recipient": "ada@example.com",
    "subject": "Your code",
    "body": "123456",
    "priority": "HIGH",
    "send_at": "2026-12-01T12:00:00Z",
    "metadata": {"order": "A-17"},
}


def _error_example(name: str, code: str, message: str, fields: dict, http: int) -> OpenApiExample:
    return OpenApiExample(
        name, value=error_body(code, message, fields), response_only=True, status_codes=[http]
    )


EXPIRES_BEFORE_SEND = "expires_at must be later than the send time (send_at, delay_seconds or now)."
ERROR_UNAUTHENTICATED = OpenApiResponse(ErrorOutput, description="Missing or wrong API key.")
ERROR_NOT_FOUND = OpenApiResponse(
    ErrorOutput, description="No such notification, or it belongs to another client."
)
ERROR_NOT_OPERATOR = OpenApiResponse(ErrorOutput, description="Not an operator client.")


CREATE = extend_schema(
    operation_id="notification_create",
    summary="Schedule a notification",
    description=(
        "Give `subject`/`body` (at most 64 KiB of UTF-8) and `send_at` (with an offset) or "
        "`delay_seconds`, or neither for now. `channel` and `priority` are case-insensitive. "
        "Unknown fields are rejected with 400, so a misspelt field never goes unnoticed. "
        "Instead of `subject`/`body`, `template` (an event name) plus `payload` renders "
        "your template for the channel; an unknown template or a placeholder the payload "
        "does not fill is a 400 naming it. Preference mode: `user_id` + `template` + "
        "`payload` and no `channel`/`recipient`; the user's preferences choose the channel "
        "and its address, later usable channels become `fallback_channels`, and 422 names "
        "each channel's reason when none is usable. `expires_at` (a time later than the send "
        "time) or `ttl_seconds` (counted from the send time) gives it an expiry: not sent by "
        "then, by the database's clock, it ends EXPIRED (a webhook event like the other final "
        "statuses) and is never sent. `cancellation_key` lets POST "
        "/api/v1/notifications/cancel cancel every notification carrying it at once."
    ),
    parameters=[IDEMPOTENCY_KEY],
    request=NotificationCreateInput,
    responses={
        201: OpenApiResponse(NotificationOutput, description="Created."),
        200: OpenApiResponse(
            NotificationOutput, description="A replay: the notification this key created."
        ),
        400: OpenApiResponse(ErrorOutput, description="Invalid; nothing was created."),
        401: ERROR_UNAUTHENTICATED,
        403: OpenApiResponse(ErrorOutput, description="CRITICAL, and your client may not send it."),
        409: OpenApiResponse(ErrorOutput, description="The key was used for another request."),
        422: OpenApiResponse(
            ErrorOutput,
            description="Preference mode: no channel of the user can carry this event.",
        ),
        429: OpenApiResponse(
            ErrorOutput,
            description="Your PENDING backlog is over its limit, or your client made too "
            "many requests in this window; see Retry-After.",
        ),
    },
    examples=[
        OpenApiExample("An email for a set time", value=EXAMPLE_REQUEST, request_only=True),
        OpenApiExample(
            "A one-time code: worthless after ten minutes, cancelled when the user logs in",
            value={
                "channel": "sms",
                "recipient": "+447700900123",
                "body": "Your code is 123456",
                "ttl_seconds": 600,
                "cancellation_key": "login-u-1-2026-12-01",
            },
            request_only=True,
        ),
        OpenApiExample(
            "A reminder that means nothing after the event",
            value={
                **EXAMPLE_REQUEST,
                "send_at": "2026-12-01T12:00:00Z",
                "expires_at": "2026-12-01T14:00:00Z",
            },
            request_only=True,
        ),
        _error_example(
            "Expires before it is sent",
            "expires_before_send",
            EXPIRES_BEFORE_SEND,
            {"expires_at": [EXPIRES_BEFORE_SEND]},
            400,
        ),
        OpenApiExample(
            "From a template, by the user's preferences",
            value={
                "user_id": "u-1",
                "template": "order_shipped",
                "payload": {"name": "Ada", "order": "A-17"},
            },
            request_only=True,
        ),
        _error_example(
            "Placeholder not filled",
            "missing_placeholders",
            "The payload does not fill {order} of the email template 'order_shipped'.",
            {"payload": ["Missing placeholder: order"]},
            400,
        ),
        _error_example(
            "No usable channel",
            "no_usable_channel",
            "No channel can carry 'order_shipped' to user 'u-1' (push: opted out; "
            "email: no address).",
            {"push": ["opted_out"], "email": ["no_address"]},
            422,
        ),
        OpenApiExample(
            "An SMS in ten minutes",
            value={
                "channel": "sms",
                "recipient": "+447700900123",
                "body": "Your table is ready",
                "delay_seconds": 600,
            },
            request_only=True,
        ),
        OpenApiExample(
            "Created", value=EXAMPLE_NOTIFICATION, response_only=True, status_codes=[201, 200]
        ),
        _error_example(
            "Invalid recipient",
            "invalid_request",
            "recipient: Not a valid email address.",
            {"recipient": ["Not a valid email address."]},
            400,
        ),
        _error_example(
            "Key reused",
            "idempotency_key_reused",
            "Idempotency key 'order-A-17-code' was already used for a different request.",
            {"idempotency_key": ["Already used for a different request."]},
            409,
        ),
    ],
)

LIST = extend_schema(
    operation_id="notification_list",
    summary="List notifications, newest first",
    description=(
        "Cursor-paginated: follow `next` for older notifications and `previous` for newer "
        "ones. An operator client sees every client's notifications. Unknown parameters "
        "and unknown filter values answer 400."
    ),
    parameters=[NotificationListFilters],
    responses={200: NotificationListOutput, 400: ErrorOutput, 401: ERROR_UNAUTHENTICATED},
    examples=[
        OpenApiExample(
            "A page",
            value={
                "next": "http://127.0.0.1:8000/api/v1/notifications?cursor=eyJkIjoi...",
                "previous": None,
                "results": [EXAMPLE_NOTIFICATION],
            },
            response_only=True,
            status_codes=[200],
        )
    ],
)

GET = extend_schema(
    operation_id="notification_get",
    summary="Read one notification",
    parameters=[NOTIFICATION_ID],
    responses={200: NotificationOutput, 401: ERROR_UNAUTHENTICATED, 404: ERROR_NOT_FOUND},
    examples=[
        OpenApiExample("Found", value=EXAMPLE_NOTIFICATION, response_only=True, status_codes=[200]),
        OpenApiExample(
            "Held while its provider's circuit is open",
            value={
                **EXAMPLE_NOTIFICATION,
                "send_at": "2026-11-30T09:15:02.114Z",
                "updated_at": "2026-11-30T09:15:02.530Z",
                "held_until": "2026-11-30T09:15:31.870Z",
                "held_reason": "circuit_open",
            },
            response_only=True,
            status_codes=[200],
        ),
        OpenApiExample(
            "Held by its user's quiet hours",
            value={
                **EXAMPLE_NOTIFICATION,
                "channel": "email",
                "recipient": "ada@example.com",
                "user_id": "ada",
                "template": "order_shipped",
                "send_at": "2026-12-07T22:10:00.000Z",
                "updated_at": "2026-12-07T22:10:00.180Z",
                "held_until": "2026-12-08T06:30:00Z",
                "held_reason": "quiet_hours",
            },
            response_only=True,
            status_codes=[200],
        ),
        OpenApiExample(
            "Sent, and its provider reported a hard bounce",
            value={
                **EXAMPLE_NOTIFICATION,
                "status": "SENT",
                "attempt_count": 1,
                "sent_at": "2026-12-01T12:00:00.250Z",
                "receipt": "bounced",
            },
            response_only=True,
            status_codes=[200],
        ),
    ],
)

CANCEL = extend_schema(
    operation_id="notification_cancel",
    summary="Cancel a PENDING notification",
    parameters=[NOTIFICATION_ID],
    request=None,
    responses={
        200: OpenApiResponse(NotificationOutput, description="Now CANCELLED."),
        401: ERROR_UNAUTHENTICATED,
        404: ERROR_NOT_FOUND,
        409: OpenApiResponse(ErrorOutput, description="It was not PENDING; nothing changed."),
    },
    examples=[
        OpenApiExample(
            "Cancelled",
            value={**EXAMPLE_NOTIFICATION, "status": "CANCELLED"},
            response_only=True,
            status_codes=[200],
        ),
        _error_example(
            "Already sent",
            "not_cancellable",
            "Only a PENDING notification can be cancelled; this one is SENT.",
            {"status": ["SENT"]},
            409,
        ),
    ],
)

CANCEL_BY_KEY = extend_schema(
    operation_id="notifications_cancel_by_key",
    summary="Cancel every notification with a cancellation key",
    description=(
        "Cancels every notification of yours created with this `cancellation_key` whose send "
        "has not started: PENDING (scheduled, held by a rate limit or an open circuit, waiting "
        "out a retry's backoff) or claimed by a worker that has not yet called the provider. "
        "Answers once all of them are CANCELLED, with how many; none of them is sent after "
        "the answer. A send already started finishes as it would have and is not counted. "
        "Another client's notifications with the same key are never touched. Safe to repeat "
        "(a second call answers 0). A 503 means some stayed locked by another transaction "
        "for 30 s: those counted so far are cancelled; send it again."
    ),
    request=CancelByKeyInput,
    responses={
        200: OpenApiResponse(CancelByKeyOutput, description="All of them are now CANCELLED."),
        400: OpenApiResponse(ErrorOutput, description="No usable cancellation_key."),
        401: ERROR_UNAUTHENTICATED,
        503: OpenApiResponse(ErrorOutput, description="Not finished; send it again."),
    },
    examples=[
        OpenApiExample(
            "Cancel a login's codes",
            value={"cancellation_key": "login-u-1-2026-12-01"},
            request_only=True,
        ),
        OpenApiExample(
            "Three cancelled", value={"cancelled": 3}, response_only=True, status_codes=[200]
        ),
    ],
)

RETRY = extend_schema(
    operation_id="notification_retry",
    summary="Retry a FAILED or DEAD_LETTERED notification (operators)",
    description=(
        "Sends the notification back to PENDING, due now, with its attempts at 0 of its "
        "maximum; `last_error` is kept and `operator_retries` goes up by one. If it fails "
        "again it is retried with backoff and, after its attempts, dead-lettered again "
        "with a second webhook. Operator clients only; any client's notification."
    ),
    parameters=[NOTIFICATION_ID],
    request=None,
    responses={
        200: OpenApiResponse(NotificationOutput, description="PENDING again."),
        401: ERROR_UNAUTHENTICATED,
        403: ERROR_NOT_OPERATOR,
        404: OpenApiResponse(ErrorOutput, description="No such notification."),
        409: OpenApiResponse(
            ErrorOutput, description="Neither FAILED nor DEAD_LETTERED; nothing changed."
        ),
    },
    examples=[
        OpenApiExample(
            "Retried",
            value={
                **EXAMPLE_NOTIFICATION,
                "last_error": "provider answered 503: busy",
                "operator_retries": 1,
            },
            response_only=True,
            status_codes=[200],
        ),
        _error_example(
            "Not retryable",
            "not_retryable",
            "Only a FAILED or DEAD_LETTERED notification can be retried; this one is SENT.",
            {"status": ["SENT"]},
            409,
        ),
        _error_example(
            "Not an operator",
            "permission_denied",
            "Only an operator client may do this.",
            {},
            403,
        ),
    ],
)

RETRY_BULK = extend_schema(
    operation_id="notification_retry_bulk",
    summary="Retry up to 1,000 notifications, oldest first (operators)",
    description=(
        "Sends back to PENDING up to 1,000 of the oldest notifications in `status` "
        "(optionally only one `channel`), each as a single retry would, and answers how "
        "many remain: repeat the call until `remaining` is 0. Two operators calling at "
        "once never retry the same notification twice. Operator clients only."
    ),
    request=BulkRetryInput,
    responses={
        200: BulkRetryOutput,
        400: OpenApiResponse(ErrorOutput, description="Not a retryable status or channel."),
        401: ERROR_UNAUTHENTICATED,
        403: ERROR_NOT_OPERATOR,
    },
    examples=[
        OpenApiExample(
            "The dead-letter queue", value={"status": "DEAD_LETTERED"}, request_only=True
        ),
        OpenApiExample(
            "Failed SMS only", value={"status": "FAILED", "channel": "sms"}, request_only=True
        ),
        OpenApiExample(
            "More remain",
            value={"retried": 1000, "remaining": 1500},
            response_only=True,
            status_codes=[200],
        ),
    ],
)

BATCH_CREATE = extend_schema(
    operation_id="notification_batch_create",
    summary="Schedule up to 1,000 notifications",
    description=(
        "Each item is a create request plus its own `idempotency_key`, and is created (or "
        "replayed, or refused) on its own: the answer is always 200 with one result per "
        "item, in order, whose `status` is what a single create would have answered. A bad "
        "envelope answers 400 and a full backlog 429, for the whole batch."
    ),
    request=BatchInput,
    responses={
        200: BatchOutput,
        400: OpenApiResponse(ErrorOutput, description="Not a list of 1 to 1,000 items."),
        401: ERROR_UNAUTHENTICATED,
        429: OpenApiResponse(
            ErrorOutput, description="Backlog over its limit, or too many requests."
        ),
    },
    examples=[
        OpenApiExample(
            "Two items",
            value={
                "notifications": [
                    {**EXAMPLE_REQUEST, "idempotency_key": "order-A-17-code"},
                    {
                        "channel": "sms",
                        "recipient": "12345",
                        "body": "Hi",
                        "idempotency_key": "order-A-17-sms",
                    },
                ]
            },
            request_only=True,
        ),
        OpenApiExample(
            "Results",
            value={
                "results": [
                    {"status": 201, "notification": EXAMPLE_NOTIFICATION},
                    {
                        "status": 400,
                        "error": error_body(
                            "invalid_request",
                            "recipient: An SMS recipient is an E.164 number.",
                            {"recipient": ["An SMS recipient is an E.164 number."]},
                        )["error"],
                    },
                ]
            },
            response_only=True,
            status_codes=[200],
        ),
    ],
)
