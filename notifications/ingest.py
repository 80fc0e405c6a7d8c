"""The thin create path: `POST /notifications` and `POST /notifications/batch` without DRF's
request machinery (docs/decisions/0001-wsgi-shortcut-for-creates.md).

DRF's request set-up, authentication, content negotiation, serializers and response rendering
cost about half of a create's CPU. This path does the same work by hand for the requests
that are plainly valid, and hands everything else to the DRF views unchanged, so that every
refusal (401, 406, 415, 400 with its field messages...) is the DRF view's own answer:

- a request goes the thin way only when it is JSON (`Content-Type: application/json`), accepts
  JSON (no `Accept`, `*/*` or `application/json`), has no query string, a usable idempotency
  key (single create), a usable API key, and a body that parses and passes every field check;
  otherwise the DRF view answers it, from the start (nothing was written or counted: the API
  throttle counts a request only once it is known to go the thin way);
- each field check here accepts exactly what the DRF field accepts and gives the same value,
  or gives up (`_INVALID`); the rules between fields are the serializer's own function
  (`create_rules_broken`); a batch item that is not plainly valid is validated by the DRF
  item serializer, as before, so its error is the one a batch always gave;
- the service, its errors and the answer's shape are the same: `notification_representation`
  is `NotificationOutput` written out (tests/integration/test_api_thin_path.py compares them),
  errors from the services go through the API's exception handler and DRF's JSON renderer,
  and the answer carries the DRF view's `Allow` header.

Bounds kept: the body was read within DATA_UPLOAD_MAX_MEMORY_SIZE (the API guard middleware
refuses a larger Content-Length), a body holding `\\u0000` anywhere goes to the DRF parser
(which refuses NUL), and an accepted body is at most 10 levels deep (every field is a scalar
but metadata and payload, which are checked to 8 levels), under the parser's 32.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.serializers import ValidationError

from clients.authentication import forget_key, remembered_key, usable_key
from clients.repositories import KeyRow
from clients.throttling import request_refused
from notifications import services
from notifications.repositories import KeyCheck, KeyCheckFailed, NotificationRecord
from notifications.serializers import (
    DELAY_SECONDS_MAX,
    JSON_FIELD_MAX_DEPTH,
    METADATA_MAX_BYTES,
    PAYLOAD_MAX_BYTES,
    OffsetDateTimeField,
    create_rules_broken,
    json_depth,
    json_unstorable,
    notification_request,
)
from notifyqueue.errors import DomainError, api_exception_handler, error_body
from notifyqueue.parsers import JSON_MAX_DEPTH
from notifyqueue.vocabulary import (
    LONE_SURROGATE,
    MAX_BODY_BYTES,
    RECIPIENT_MAX_LENGTH,
    USER_ID_MAX_LENGTH,
    Channel,
    Priority,
)
from preferences.routing import NotificationContent
from templates.models import EVENT_MAX_LENGTH, SUBJECT_MAX_LENGTH

# The DRF view a request goes to when the thin path does not settle it; under the WSGI shortcut
# (notifyqueue/shortcuts.py) a function answering None: the request then goes the long way.
View = Callable[..., HttpResponse | None]

_JSON_TYPES = frozenset(
    {"application/json", "application/json; charset=utf-8", "application/json;charset=utf-8"}
)
# Accept values that DRF's negotiation answers with plain `application/json` (no parameters).
_ACCEPT_JSON = frozenset({"", "*/*", "application/json"})
_NUL_ESCAPE = b"\\u0000"
_INVALID = object()
_RENDERER = JSONRenderer()


# ---------------------------------------------------------------- field checks
# Each returns what the DRF field of notifications/serializers.py returns for this value, or
# _INVALID where that field would refuse it, or where its answer is not plain (a number for a
# text field, which DRF turns into text): the DRF serializer then decides.


def _text(*, max_length: int, trim: bool, allow_blank: bool) -> Callable[[Any], Any]:
    """serializers.CharField(max_length=, trim_whitespace=, allow_blank=)."""

    def check(value: Any) -> Any:
        if type(value) is not str:
            return _INVALID
        if trim:
            value = value.strip()
        if value == "":
            return "" if allow_blank else _INVALID
        if len(value) > max_length:
            return _INVALID
        if not value.isascii() and LONE_SURROGATE.search(value):
            return _INVALID
        return value

    return check


def _choice(choices: list[str]) -> Callable[[Any], Any]:
    """CaseInsensitiveChoiceField(choices=...)."""
    by_folded = {choice.casefold(): choice for choice in choices}

    def check(value: Any) -> Any:
        if type(value) is not str:
            return _INVALID
        return by_folded.get(value.casefold(), _INVALID)

    return check


_channel = _choice(Channel.values)
_priority_name = _choice(Priority.names)


def _priority(value: Any) -> Any:
    """PriorityField."""
    name = _priority_name(value)
    return _INVALID if name is _INVALID else Priority[name]


def _json_object(*, max_bytes: int) -> Callable[[Any], Any]:
    """BoundedJSONObjectField(max_bytes=...)."""

    def check(value: Any) -> Any:
        if type(value) is not dict or json_depth(value) > JSON_FIELD_MAX_DEPTH:
            return _INVALID
        if json_unstorable(value) is not None:
            return _INVALID
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        return _INVALID if size > max_bytes else value

    return check


def _delay_seconds(value: Any) -> Any:
    """StrictIntegerField(min_value=0, max_value=DELAY_SECONDS_MAX)."""
    if type(value) is not int or not 0 <= value <= DELAY_SECONDS_MAX:
        return _INVALID
    return value


_SEND_AT = OffsetDateTimeField()


def _send_at(value: Any) -> Any:
    """OffsetDateTimeField."""
    if type(value) is not str:
        return _INVALID
    try:
        return _SEND_AT.to_internal_value(value)
    except ValidationError:
        return _INVALID


def _idempotency_key(value: Any) -> Any:
    """BatchItemInput.idempotency_key."""
    if type(value) is not str or services.idempotency_key_problem(value) is not None:
        return _INVALID
    return value


CREATE_FIELDS: dict[str, Callable[[Any], Any]] = {
    "channel": _channel,
    "recipient": _text(max_length=RECIPIENT_MAX_LENGTH, trim=True, allow_blank=False),
    "subject": _text(max_length=SUBJECT_MAX_LENGTH, trim=False, allow_blank=True),
    "body": _text(max_length=MAX_BODY_BYTES, trim=False, allow_blank=False),
    "priority": _priority,
    "send_at": _send_at,
    "delay_seconds": _delay_seconds,
    "metadata": _json_object(max_bytes=METADATA_MAX_BYTES),
    "template": _text(max_length=EVENT_MAX_LENGTH, trim=True, allow_blank=False),
    "payload": _json_object(max_bytes=PAYLOAD_MAX_BYTES),
    "user_id": _text(max_length=USER_ID_MAX_LENGTH, trim=True, allow_blank=False),
}
BATCH_ITEM_FIELDS = {**CREATE_FIELDS, "idempotency_key": _idempotency_key}


def create_fields(data: Any, checks: dict[str, Callable[[Any], Any]]) -> dict[str, Any] | None:
    """The validated data `NotificationCreateInput` (or `BatchItemInput`) gives for `data`, when
    it is valid and every value is plain; None otherwise (the serializer then decides)."""
    if type(data) is not dict:
        return None
    fields: dict[str, Any] = {}
    for name, value in data.items():
        check = checks.get(name)
        if check is None:
            return None
        checked = check(value)
        if checked is _INVALID:
            return None
        fields[name] = checked
    if "idempotency_key" in checks and "idempotency_key" not in fields:
        return None  # required in a batch item
    if create_rules_broken(fields):
        return None
    return fields


# ---------------------------------------------------------------- the answer


def _when(value: datetime | None) -> str | None:
    """serializers.DateTimeField().to_representation (ISO 8601 in UTC, `Z`), without looking
    up the current time zone for every value: the API never activates another than UTC."""
    if not value:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def notification_representation(
    record: NotificationRecord, when: Callable[[datetime | None], str | None] = _when
) -> dict[str, Any]:
    """`NotificationOutput(record).data`, field for field."""
    return {
        "id": str(record.id),
        "status": record.status,
        "channel": record.channel,
        "recipient": record.recipient,
        "priority": Priority(record.priority).name,
        "send_at": when(record.send_at),
        "created_at": when(record.created_at),
        "updated_at": when(record.updated_at),
        "attempt_count": record.attempt_count,
        "max_attempts": record.max_attempts,
        "last_error": record.last_error,
        "sent_at": when(record.sent_at),
        "idempotency_key": record.idempotency_key,
        "metadata": record.metadata,
        "user_id": record.user_id,
        "template": record.template,
        "fallback_channels": record.fallback_channels,
        "operator_retries": record.operator_retries,
        "held_until": when(record.held_until),
        "held_reason": record.held_reason,
    }


def _json_response(data: Any, *, status: int, allow: str) -> HttpResponse:
    # The charset the long way's answer reports (none in its Content-Type: the default), given
    # so that reading it (the request metrics do) parses no header.
    response = HttpResponse(
        _RENDERER.render(data),
        status=status,
        content_type="application/json",
        charset=settings.DEFAULT_CHARSET,
    )
    response["Allow"] = allow
    return response


def _error_response(error: Exception, *, allow: str) -> HttpResponse:
    """The answer the DRF view gives for `error` (a DomainError or a DRF exception)."""
    answer = api_exception_handler(error, {})
    response = _json_response(answer.data, status=answer.status_code, allow=allow)
    for name, value in answer.items():
        # An unrendered DRF Response holds Django's default Content-Type, not the JSON one.
        if name.lower() != "content-type":
            response[name] = value
    return response


def _times_formatter() -> Callable[[datetime | None], str | None]:
    """`_when` for the times of one answer, each distinct one formatted once: a new row's
    creation and update times are one value, mostly its send and due times too, and the rows
    of a batch share theirs."""
    formatted: dict[datetime, str | None] = {}

    def when(value: datetime | None) -> str | None:
        if value is None:
            return None
        text = formatted.get(value)
        if text is None:
            text = formatted[value] = _when(value)
        return text

    return when


# ---------------------------------------------------------------- the request


def _plain_json_request(request: HttpRequest) -> bool:
    meta = request.META
    return (
        meta.get("CONTENT_TYPE", "").lower() in _JSON_TYPES
        and meta.get("HTTP_ACCEPT", "") in _ACCEPT_JSON
        and not meta.get("QUERY_STRING")
    )


def _body(request: HttpRequest) -> Any:
    """The JSON body as DRF's parser (notifyqueue/parsers.py) decodes it, or _INVALID where
    that parser would refuse it or might (a `\\u0000` escape anywhere)."""
    raw = request.body
    if not raw or _NUL_ESCAPE in raw:
        return _INVALID
    try:
        return json.loads(raw.decode(settings.DEFAULT_CHARSET))
    except (ValueError, RecursionError):
        return _INVALID


def _throttled(caller: KeyRow, allow: str) -> HttpResponse | None:
    """Counts the request in the API throttle (clients/throttling.py); its 429 when refused."""
    wait = request_refused(caller.client_id)
    if wait is None:
        return None
    return _error_response(exceptions.Throttled(wait), allow=allow)


def _critical_refused(caller: KeyRow, fields: dict[str, Any]) -> bool:
    return fields.get("priority") == Priority.CRITICAL and not caller.may_send_critical


def create(request: HttpRequest, *, drf_view: View, allow: str) -> HttpResponse | None:
    """POST /notifications."""
    key = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if not _plain_json_request(request) or services.idempotency_key_problem(key) is not None:
        return drf_view(request)
    header = request.META.get("HTTP_AUTHORIZATION")
    fields = create_fields(_body(request), CREATE_FIELDS)
    counted = False
    renderer = services.RenderedOnce(NotificationContent())
    if fields is not None:
        answer, counted = _create_checked(header, key, fields, allow, renderer)
        if answer is not None:
            return answer
    caller = usable_key(header)
    if caller is None or fields is None or _critical_refused(caller, fields):
        return drf_view(request)
    if not counted:
        refusal = _throttled(caller, allow)
        if refusal is not None:
            return refusal
    try:
        result = services.notification_create(
            client_id=caller.client_id,
            idempotency_key=key,
            request=notification_request(fields),
            renderer=renderer,
        )
    except DomainError as error:
        return _error_response(error, allow=allow)
    return _created(result, allow)


def _create_checked(
    header: str | None,
    key: str,
    fields: dict[str, Any],
    allow: str,
    renderer: services.TemplateRenderer,
) -> tuple[HttpResponse | None, bool]:
    """The create in one statement that also checks the API key, for a key this process
    authenticated before: its 201 or 200, or None for anything else (nothing was written,
    nothing of the client's read), and whether the API throttle counted the request. On None
    the caller goes the long way, which authenticates first.

    The throttle counts the request before the statement (from the process's reserved block,
    clients/throttling.py, mostly without a statement); over the limit, the long way answers
    (a key revoked since must answer 401, not 429). Not for CRITICAL, whose permission is
    checked before the backlog."""
    if fields.get("priority") == Priority.CRITICAL:
        return None, False
    remembered = remembered_key(header)
    if remembered is None:
        return None, False
    prefix, row = remembered
    if request_refused(row.client_id) is not None:
        return None, False
    try:
        result = services.notification_create(
            client_id=row.client_id,
            idempotency_key=key,
            request=notification_request(fields),
            renderer=renderer,
            key_check=KeyCheck(prefix=prefix, hashed_key=row.hashed_key),
        )
    except KeyCheckFailed:
        forget_key(prefix)
        return None, True
    except DomainError:
        return None, True
    except psycopg.OperationalError:
        # A persistent connection the server closed since the last request (what Django's
        # per-request health check finds, which this statement skips). Nothing can have been
        # written on it; the long way reconnects.
        if connection.in_atomic_block:
            raise
        connection.close()
        return None, True
    return _created(result, allow), True


def _created(result: services.CreateResult, allow: str) -> HttpResponse:
    return _json_response(
        notification_representation(result.notification, _times_formatter()),
        status=201 if result.created else 200,
        allow=allow,
    )


def batch(
    request: HttpRequest,
    *,
    drf_view: View,
    allow: str,
    item_slow: Callable[[Any, KeyRow], services.BatchItem | DomainError],
) -> HttpResponse | None:
    """POST /notifications/batch. `item_slow` validates an item that is not plainly valid with
    the DRF item serializer (notifications/views.py), as the DRF view does."""
    if not _plain_json_request(request):
        return drf_view(request)
    caller = usable_key(request.META.get("HTTP_AUTHORIZATION"))
    if caller is None:
        return drf_view(request)
    data = _body(request)
    raw_items = data.get("notifications") if type(data) is dict and len(data) == 1 else None
    if type(raw_items) is not list or not 1 <= len(raw_items) <= 1000:
        return drf_view(request)
    items: list[services.BatchItem | DomainError] = []
    for raw in raw_items:
        fields = create_fields(raw, BATCH_ITEM_FIELDS)
        if fields is None:
            # The envelope's own refusals (a null item, or nesting past the parser's limit)
            # are the DRF view's to give, for the whole request.
            if raw is None or 2 + json_depth(raw) > JSON_MAX_DEPTH:
                return drf_view(request)
            items.append(item_slow(raw, caller))
        elif _critical_refused(caller, fields):
            items.append(item_slow(raw, caller))
        else:
            items.append(
                services.BatchItem(
                    idempotency_key=fields["idempotency_key"], request=notification_request(fields)
                )
            )
    refusal = _throttled(caller, allow)
    if refusal is not None:
        return refusal
    try:
        outcomes = services.notification_batch_create(
            client_id=caller.client_id, items=items, renderer=NotificationContent()
        )
    except DomainError as error:
        return _error_response(error, allow=allow)
    return _json_response({"results": batch_results(outcomes)}, status=200, allow=allow)


def batch_results(outcomes: list[services.BatchOutcome]) -> list[dict[str, Any]]:
    """`BatchOutput`'s results: each item's status, and its notification or its error. The
    rows of one batch share their creation time (and mostly their send time): each distinct
    time is formatted once."""
    when = _times_formatter()
    results = []
    for outcome in outcomes:
        if outcome.error is None:
            results.append(
                {
                    "status": outcome.http_status,
                    "notification": notification_representation(outcome.notification, when),
                }
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
