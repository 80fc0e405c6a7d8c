"""HTTP for notifications: parse and validate, call one service, shape the answer."""

from __future__ import annotations

import threading
import uuid

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from clients.permissions import IsOperator
from notifications import services
from notifications.models import Priority
from notifications.serializers import (
    BatchInput,
    BatchItemInput,
    BatchOutput,
    BulkRetryInput,
    BulkRetryOutput,
    NotificationCreateInput,
    NotificationListFilters,
    NotificationListOutput,
    NotificationOutput,
    notification_request,
)
from notifyqueue.errors import InvalidRequest, error_body
from notifyqueue.serializers import ErrorOutput
from preferences.services import NotificationContent

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


ERROR_UNAUTHENTICATED = OpenApiResponse(ErrorOutput, description="Missing or wrong API key.")
ERROR_NOT_FOUND = OpenApiResponse(
    ErrorOutput, description="No such notification, or it belongs to another client."
)
ERROR_NOT_OPERATOR = OpenApiResponse(ErrorOutput, description="Not an operator client.")


class CriticalNotAllowed(InvalidRequest):
    """CRITICAL from a client without the permission. An InvalidRequest so that a batch item
    carries it like any other refused item; the answer is 403, not 400."""

    code = "critical_not_allowed"
    http_status = status.HTTP_403_FORBIDDEN

    def __init__(self) -> None:
        message = (
            "Your client may not send CRITICAL notifications; an operator can allow it "
            "(admin, or create_client --critical)."
        )
        super().__init__(message, fields={"priority": [message]})


def _priority_allowed(client, priority: Priority | None) -> None:
    """Raises CriticalNotAllowed for CRITICAL from a client without the permission:
    CRITICAL goes before every other client's work and skips the rate limit."""
    if priority == Priority.CRITICAL and not getattr(client, "may_send_critical", False):
        raise CriticalNotAllowed()


def _notification_id(raw: str) -> uuid.UUID:
    """The path's id; anything that is not a UUID cannot name a notification, so 404."""
    try:
        return uuid.UUID(raw)
    except ValueError as exc:
        raise services.NotificationNotFound(raw) from exc


class NotificationCollectionView(APIView):
    """`POST /notifications` creates; `GET /notifications` lists."""

    @extend_schema(
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
            "each channel's reason when none is usable."
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
            403: OpenApiResponse(
                ErrorOutput, description="CRITICAL, and your client may not send it."
            ),
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
    def post(self, request: Request) -> Response:
        key = request.headers.get(IDEMPOTENCY_HEADER)
        problem = services.idempotency_key_problem(key)
        if problem:
            raise InvalidRequest(
                f"{IDEMPOTENCY_HEADER}: {problem}", fields={IDEMPOTENCY_HEADER: [problem]}
            )
        data = _validated(_SHAPES.create, request.data)
        _priority_allowed(request.user, data.get("priority"))
        result = services.notification_create(
            client_id=request.user.id,
            idempotency_key=key,
            request=notification_request(data),
            renderer=NotificationContent(),
        )
        return Response(
            _SHAPES.output.to_representation(result.notification),
            status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK,
        )

    @extend_schema(
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
    def get(self, request: Request) -> Response:
        query = NotificationListFilters(data=request.query_params)
        query.is_valid(raise_exception=True)
        page = services.notification_list(
            client_id=request.user.id,
            is_operator=request.user.is_operator,
            filters=query.to_filters(),
            cursor=query.validated_data.get("cursor"),
            page_size=query.validated_data["page_size"],
        )
        url = request.build_absolute_uri()
        body = {
            "next": page.next_cursor and replace_query_param(url, "cursor", page.next_cursor),
            "previous": page.previous_cursor
            and replace_query_param(url, "cursor", page.previous_cursor),
            "results": page.notifications,
        }
        return Response(NotificationListOutput(body).data)


class NotificationDetailView(APIView):
    @extend_schema(
        operation_id="notification_get",
        summary="Read one notification",
        parameters=[NOTIFICATION_ID],
        responses={200: NotificationOutput, 401: ERROR_UNAUTHENTICATED, 404: ERROR_NOT_FOUND},
        examples=[
            OpenApiExample(
                "Found", value=EXAMPLE_NOTIFICATION, response_only=True, status_codes=[200]
            )
        ],
    )
    def get(self, request: Request, notification_id: str) -> Response:
        found = services.notification_get(
            notification_id=_notification_id(notification_id),
            client_id=request.user.id,
            is_operator=request.user.is_operator,
        )
        return Response(NotificationOutput(found).data)


class NotificationCancelView(APIView):
    @extend_schema(
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
    def post(self, request: Request, notification_id: str) -> Response:
        cancelled = services.notification_cancel(
            notification_id=_notification_id(notification_id),
            client_id=request.user.id,
            now=timezone.now(),
        )
        return Response(NotificationOutput(cancelled).data)


def _operator(request: Request) -> str:
    """How an API retry is recorded on the notification."""
    return f"api:{request.user.name}"


class NotificationRetryView(APIView):
    permission_classes = [*APIView.permission_classes, IsOperator]

    @extend_schema(
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
    def post(self, request: Request, notification_id: str) -> Response:
        retried = services.notification_retry(
            notification_id=_notification_id(notification_id),
            operator=_operator(request),
            now=timezone.now(),
        )
        return Response(NotificationOutput(retried).data)


class NotificationBulkRetryView(APIView):
    permission_classes = [*APIView.permission_classes, IsOperator]

    @extend_schema(
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
    def post(self, request: Request) -> Response:
        payload = BulkRetryInput(data=request.data)
        payload.is_valid(raise_exception=True)
        result = services.notifications_retry_bulk(
            status=payload.validated_data["status"],
            channel=payload.validated_data.get("channel"),
            operator=_operator(request),
            now=timezone.now(),
        )
        return Response(
            BulkRetryOutput({"retried": result.retried, "remaining": result.remaining}).data
        )


class NotificationBatchView(APIView):
    @extend_schema(
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
    def post(self, request: Request) -> Response:
        envelope = BatchInput(data=request.data)
        envelope.is_valid(raise_exception=True)
        outcomes = services.notification_batch_create(
            client_id=request.user.id,
            items=_batch_items(envelope.validated_data["notifications"], client=request.user),
            renderer=NotificationContent(),
        )
        return Response({"results": _batch_results(outcomes)})


class _Shapes(threading.local):
    """The create path's serializers, one instance of each per thread, reused: a new DRF
    serializer deep-copies every declared field, which cost a quarter of a create's CPU and
    65 % of a 1,000-item batch's (py-spy, docs/performance.md)."""

    def __init__(self) -> None:
        self.create = NotificationCreateInput()
        self.batch_item = BatchItemInput()
        self.output = NotificationOutput()


_SHAPES = _Shapes()


def _validated(serializer: serializers.Serializer, data) -> dict:
    """What `serializer(data=data).is_valid(raise_exception=True)` would give, on an instance
    that is reused."""
    serializer.initial_data = data
    try:
        return serializer.run_validation(data)
    except serializers.ValidationError as exc:
        raise serializers.ValidationError(serializers.as_serializer_error(exc)) from exc


def _batch_items(raw_items: list, *, client) -> list[services.BatchItem | InvalidRequest]:
    items: list[services.BatchItem | InvalidRequest] = []
    for raw in raw_items:
        try:
            data = _validated(_SHAPES.batch_item, raw)
        except serializers.ValidationError as exc:
            items.append(_invalid(exc.detail))
            continue
        try:
            _priority_allowed(client, data.get("priority"))
        except CriticalNotAllowed as refused:
            items.append(refused)
            continue
        items.append(
            services.BatchItem(
                idempotency_key=data["idempotency_key"], request=notification_request(data)
            )
        )
    return items


def _batch_results(outcomes: list[services.BatchOutcome]) -> list[dict]:
    show = _SHAPES.output.to_representation
    results = []
    for outcome in outcomes:
        if outcome.error is None:
            results.append(
                {"status": outcome.http_status, "notification": show(outcome.notification)}
            )
        else:
            error = outcome.error
            results.append(
                {
                    "status": outcome.http_status,
                    "error": error_body(error.code, error.message, error.fields)["error"],
                }
            )
    return results


def _invalid(errors: dict) -> InvalidRequest:
    """The error a single create would have answered for this item."""
    fields = dict(errors)
    name, messages = next(iter(fields.items()))
    first = messages[0] if isinstance(messages, list) and messages else messages
    return InvalidRequest(f"{name}: {first}", fields=fields)
