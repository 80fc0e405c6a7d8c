"""HTTP for notifications: parse and validate, call one service, shape the answer."""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from clients.permissions import IsOperator
from monitoring.middleware import ShortcutMetrics
from notifications import ingest, listing, retries, schema, services
from notifications.schema import IDEMPOTENCY_HEADER
from notifications.serializers import (
    BATCH_ITEM_PLAIN,
    CREATE_PLAIN,
    BatchInput,
    BatchItemInput,
    BulkRetryInput,
    BulkRetryOutput,
    CancelByKeyInput,
    CancelByKeyOutput,
    NotificationCreateInput,
    NotificationListFilters,
    NotificationListOutput,
    NotificationOutput,
    notification_request,
)
from notifyqueue.errors import InvalidRequest, error_body
from notifyqueue.serializers import PlainValidator
from notifyqueue.serving.shortcuts import Shortcut, Shortcuts
from preferences.routing import NotificationContent


def _notification_id(raw: str) -> uuid.UUID:
    """The path's id; anything that is not a UUID cannot name a notification, so 404."""
    try:
        return uuid.UUID(raw)
    except ValueError as exc:
        raise services.NotificationNotFound(raw) from exc


class NotificationCollectionView(APIView):
    """`POST /notifications` creates; `GET /notifications` lists."""

    @schema.CREATE
    def post(self, request: Request) -> Response:
        key = request.headers.get(IDEMPOTENCY_HEADER)
        problem = services.idempotency_key_problem(key)
        if problem:
            raise InvalidRequest(
                f"{IDEMPOTENCY_HEADER}: {problem}", fields={IDEMPOTENCY_HEADER: [problem]}
            )
        data = _validated(CREATE_PLAIN, _SHAPES.create, request.data)
        services.notification_priority_check(
            priority=data.get("priority"), may_send_critical=request.user.may_send_critical
        )
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

    @schema.LIST
    def get(self, request: Request) -> Response:
        query = NotificationListFilters(data=request.query_params)
        query.is_valid(raise_exception=True)
        page = listing.notification_list(
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
    @schema.GET
    def get(self, request: Request, notification_id: str) -> Response:
        found = services.notification_get(
            notification_id=_notification_id(notification_id),
            client_id=request.user.id,
            is_operator=request.user.is_operator,
        )
        return Response(NotificationOutput(found).data)


class NotificationCancelView(APIView):
    @schema.CANCEL
    def post(self, request: Request, notification_id: str) -> Response:
        cancelled = services.notification_cancel(
            notification_id=_notification_id(notification_id),
            client_id=request.user.id,
            now=timezone.now(),
        )
        return Response(NotificationOutput(cancelled).data)


class NotificationCancelByKeyView(APIView):
    @schema.CANCEL_BY_KEY
    def post(self, request: Request) -> Response:
        payload = CancelByKeyInput(data=request.data)
        payload.is_valid(raise_exception=True)
        cancelled = services.notifications_cancel_by_key(
            client_id=request.user.id,
            cancellation_key=payload.validated_data["cancellation_key"],
        )
        return Response(CancelByKeyOutput({"cancelled": cancelled}).data)


def _operator(request: Request) -> str:
    """How an API retry is recorded on the notification."""
    return f"api:{request.user.name}"


class NotificationRetryView(APIView):
    permission_classes = [*APIView.permission_classes, IsOperator]

    @schema.RETRY
    def post(self, request: Request, notification_id: str) -> Response:
        retried = retries.notification_retry(
            notification_id=_notification_id(notification_id),
            operator=_operator(request),
            now=timezone.now(),
        )
        return Response(NotificationOutput(retried).data)


class NotificationBulkRetryView(APIView):
    permission_classes = [*APIView.permission_classes, IsOperator]

    @schema.RETRY_BULK
    def post(self, request: Request) -> Response:
        payload = BulkRetryInput(data=request.data)
        payload.is_valid(raise_exception=True)
        result = retries.notifications_retry_bulk(
            status=payload.validated_data["status"],
            channel=payload.validated_data.get("channel"),
            operator=_operator(request),
            now=timezone.now(),
        )
        return Response(
            BulkRetryOutput({"retried": result.retried, "remaining": result.remaining}).data
        )


class NotificationBatchView(APIView):
    @schema.BATCH_CREATE
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
    65 % of a 1,000-item batch's (py-spy)."""

    def __init__(self) -> None:
        self.create = NotificationCreateInput()
        self.batch_item = BatchItemInput()
        self.output = NotificationOutput()


_SHAPES = _Shapes()


def _validated(plain: PlainValidator, serializer: serializers.Serializer, data) -> dict:
    """What `serializer(data=data).is_valid(raise_exception=True)` would give: by `plain`, the
    serializer's own field checks, for data that is plainly valid (as the thin path checks
    it); otherwise by the serializer, on an instance that is reused, with its messages."""
    validated = plain.validated(data)
    if validated is not None:
        return validated
    serializer.initial_data = data
    try:
        return serializer.run_validation(data)
    except serializers.ValidationError as exc:
        raise serializers.ValidationError(serializers.as_serializer_error(exc)) from exc


def _batch_item(raw, client) -> services.BatchItem | InvalidRequest:
    """One batch item, validated by the DRF item serializer: the item, or its error."""
    try:
        data = _validated(BATCH_ITEM_PLAIN, _SHAPES.batch_item, raw)
    except serializers.ValidationError as exc:
        return _invalid(exc.detail)
    try:
        services.notification_priority_check(
            priority=data.get("priority"), may_send_critical=client.may_send_critical
        )
    except services.CriticalNotAllowed as refused:
        return refused
    return services.BatchItem(
        idempotency_key=data["idempotency_key"], request=notification_request(data)
    )


def _batch_items(raw_items: list, *, client) -> list[services.BatchItem | InvalidRequest]:
    return [_batch_item(raw, client) for raw in raw_items]


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


def _allowed_methods(drf_class: type[APIView]) -> str:
    """The DRF view's `Allow` header, which the thin path's answers carry too."""
    described = drf_class()
    described.setup(None)
    return ", ".join(described.allowed_methods)


def _thin_post(drf_class: type[APIView], post: Callable[..., HttpResponse | None]) -> Callable:
    """The URL's view: POST goes the thin path (notifications/ingest.py), which hands any
    request that is not plainly valid to the DRF view; other methods, and a POST the thin
    path already gave back under the WSGI shortcut, go to the DRF view. The DRF view stays
    what the OpenAPI schema documents (`cls`, `initkwargs`)."""
    drf_view = drf_class.as_view()
    allow = _allowed_methods(drf_class)

    @csrf_exempt
    def view(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.method == "POST" and not ingest.given_back(request):
            return post(request, drf_view=drf_view, allow=allow)
        return drf_view(request, *args, **kwargs)

    view.cls = drf_view.cls
    view.initkwargs = drf_view.initkwargs
    return view


_create_batch = functools.partial(ingest.batch, item_slow=_batch_item)
notification_collection = _thin_post(NotificationCollectionView, ingest.create)
notification_batch = _thin_post(NotificationBatchView, _create_batch)


def _long_way(request: HttpRequest) -> None:
    """The shortcut's `drf_view`: the request goes through Django's handler to the URL's view."""
    return None


def api_shortcuts() -> Shortcuts:
    """`settings.API_SHORTCUTS`: the thin path's two POSTs, taken before Django's handler
    (notifyqueue/serving/shortcuts.py). Whatever the thin path gives back goes the long way."""
    routes = {}
    for name, drf_class, post in (
        ("notification-list", NotificationCollectionView, ingest.create),
        ("notification-batch", NotificationBatchView, _create_batch),
    ):
        answer = functools.partial(post, drf_view=_long_way, allow=_allowed_methods(drf_class))
        routes[reverse(name)] = Shortcut(view_name=name, answer=answer)
    return Shortcuts(routes=routes, record=ShortcutMetrics())


def _invalid(errors: dict) -> InvalidRequest:
    """The error a single create would have answered for this item."""
    fields = dict(errors)
    name, messages = next(iter(fields.items()))
    first = messages[0] if isinstance(messages, list) and messages else messages
    return InvalidRequest(f"{name}: {first}", fields=fields)
