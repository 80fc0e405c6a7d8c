"""The thin create path: `POST /notifications` and `POST /notifications/batch` without DRF's
request machinery (docs/decisions/0001-wsgi-shortcut-for-creates.md).

DRF's request set-up, authentication, content negotiation, serializers and response rendering
cost about half of a create's CPU. This path does the same work by hand, and is the one way in
for a create: each request either goes to the DRF view before anything is done for it, or is
answered here, never both.

- It is given to the DRF view, untouched, when it is not plainly valid: not JSON
  (`Content-Type: application/json`), not accepting JSON (no `Accept`, `*/*` or
  `application/json`), a query string, an unusable idempotency key (single create), a body
  that does not parse, or one the field checks do not accept. Nothing was authenticated,
  counted or written; the DRF view answers it with its own messages (406, 415, 400...).
- Otherwise it is answered here: the API key authenticated once (`_Caller`: the function
  DRF's authentication runs, or a key this process authenticated before, which the create
  statement checks), the API throttle, the CRITICAL permission and the create service, each
  once; every refusal is rendered by the API's exception handler as the DRF view renders it
  (tests/integration/test_api_thin_path.py and test_api_shortcut.py compare them).
- The field checks are the serializers' own (`CREATE_PLAIN`, `BATCH_ITEM_PLAIN`,
  notifications/serializers.py): each field of `NotificationCreateInput` checks a value it
  accepts as it stands, and the rules between fields are the serializer's. A batch item that
  is not plainly valid is validated by the DRF item serializer, so its error is the one a
  batch always gave.
- `notification_representation` is `NotificationOutput` written out, and the answer carries
  the DRF view's `Allow` header.

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

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer

from clients.authentication import (
    KEYWORD,
    api_key_authenticate,
    forget_key,
    remembered_key,
)
from clients.repositories import KeyRow
from clients.throttling import request_refused
from notifications import services
from notifications.repositories import KeyCheck, NotificationRecord
from notifications.serializers import (
    BATCH_ITEM_PLAIN,
    CREATE_PLAIN,
    json_depth,
    notification_request,
)
from notifyqueue.errors import DomainError, api_exception_handler, error_body
from notifyqueue.parsers import JSON_MAX_DEPTH
from notifyqueue.vocabulary import Priority
from preferences.routing import NotificationContent

# The DRF view a request goes to when the thin path does not take it; under the WSGI shortcut
# (notifyqueue/serving/shortcuts.py) a function answering None: the request then goes the long way.
View = Callable[..., HttpResponse | None]

_JSON_TYPES = frozenset(
    {"application/json", "application/json; charset=utf-8", "application/json;charset=utf-8"}
)
# Accept values that DRF's negotiation answers with plain `application/json` (no parameters).
_ACCEPT_JSON = frozenset({"", "*/*", "application/json"})
_NUL_ESCAPE = b"\\u0000"
# In the environ of a request the thin path gave back to the DRF view.
GIVEN_BACK = "notifyqueue.thin_path.given_back"
_UNREADABLE = object()
_RENDERER = JSONRenderer()


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
        "expires_at": when(record.expires_at),
        "cancellation_key": record.cancellation_key,
        "held_until": when(record.held_until),
        "held_reason": record.held_reason,
        "digest_bucket": None if record.digest_bucket_id is None else str(record.digest_bucket_id),
        "digest_id": None if record.digest_id is None else str(record.digest_id),
        "receipt": record.receipt,
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
    if isinstance(error, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        # As the DRF view answers them (`APIView.handle_exception`): 401, naming the scheme.
        error.auth_header = KEYWORD
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
    """The JSON body as DRF's parser (notifyqueue/parsers.py) decodes it, or _UNREADABLE where
    that parser would refuse it or might (a `\\u0000` escape anywhere)."""
    raw = request.body
    if not raw or _NUL_ESCAPE in raw:
        return _UNREADABLE
    try:
        return json.loads(raw.decode(settings.DEFAULT_CHARSET))
    except (ValueError, RecursionError):
        return _UNREADABLE


class _Caller:
    """The request's API key, authenticated once: looked up now (`api_key_authenticate`), or
    remembered from an earlier request of this process (`remembered_key`), whose usability
    the create statement checks (`services.UnconfirmedKey`); `confirm` looks such a key up
    where that statement cannot tell. CRITICAL never takes a remembered key: its permission
    is read with the key, before the backlog."""

    __slots__ = ("check", "confirmed", "header", "row")

    def __init__(self, header: str | None, *, may_remember: bool) -> None:
        self.header = header
        remembered = remembered_key(header) if may_remember else None
        if remembered is None:
            self.row = api_key_authenticate(header)
            self.confirmed = True
        else:
            prefix, self.row = remembered
            self.check = KeyCheck(prefix=prefix, hashed_key=self.row.hashed_key)
            self.confirmed = False

    def confirm(self) -> None:
        """Looks the remembered key up; raises the API's 401 when it is no longer usable."""
        if not self.confirmed:
            forget_key(self.check.prefix)
            self.row = api_key_authenticate(self.header)
            self.confirmed = True

    def admitted(self) -> None:
        """Counts the request in the API throttle; raises its 429 when refused, once the key
        is known usable (a key revoked since must answer 401)."""
        try:
            _admitted(self.row)
        except exceptions.Throttled:
            self.confirm()
            raise


def _admitted(caller: KeyRow) -> None:
    """Counts the request in the API throttle (clients/throttling.py); raises its 429 when
    refused."""
    wait = request_refused(caller.client_id)
    if wait is not None:
        raise exceptions.Throttled(wait)


def _given_back(request: HttpRequest, drf_view: View) -> HttpResponse | None:
    """The DRF view's answer (None under the WSGI shortcut: the long way's); marked, so that
    the URL's view (notifications/views.py) hands it to the DRF view at once."""
    request.META[GIVEN_BACK] = True
    return drf_view(request)


def given_back(request: HttpRequest) -> bool:
    """Whether the thin path gave this request back (under the WSGI shortcut)."""
    return GIVEN_BACK in request.META


def create(request: HttpRequest, *, drf_view: View, allow: str) -> HttpResponse | None:
    """POST /notifications. A request that is not plainly valid is given to the DRF view
    before anything is authenticated, counted or written; any other is answered here, its API
    key authenticated once and the create service called once."""
    key = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if not _plain_json_request(request) or services.idempotency_key_problem(key) is not None:
        return _given_back(request, drf_view)
    fields = CREATE_PLAIN.validated(_body(request))
    if fields is None:
        return _given_back(request, drf_view)
    priority = fields.get("priority")
    try:
        caller = _Caller(
            request.META.get("HTTP_AUTHORIZATION"), may_remember=priority != Priority.CRITICAL
        )
        caller.admitted()
        services.notification_priority_check(
            priority=priority, may_send_critical=caller.row.may_send_critical
        )
        result = services.notification_create(
            client_id=caller.row.client_id,
            idempotency_key=key,
            request=notification_request(fields),
            renderer=NotificationContent(),
            unconfirmed_key=None if caller.confirmed else caller,
        )
    except (DomainError, exceptions.APIException) as error:
        return _error_response(error, allow=allow)
    return _created(result, allow)


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
    """POST /notifications/batch. As `create`: a request whose envelope is not plainly valid
    goes to the DRF view before anything else. `item_slow` validates an item that is not
    plainly valid with the DRF item serializer (notifications/views.py), as the DRF view
    does."""
    if not _plain_json_request(request):
        return _given_back(request, drf_view)
    data = _body(request)
    raw_items = data.get("notifications") if type(data) is dict and len(data) == 1 else None
    if type(raw_items) is not list or not 1 <= len(raw_items) <= 1000:
        return _given_back(request, drf_view)
    checked = []
    for raw in raw_items:
        fields = BATCH_ITEM_PLAIN.validated(raw)
        # The envelope's own refusals (a null item, or nesting past the parser's limit) are
        # the DRF view's to give, for the whole request.
        if fields is None and (raw is None or 2 + json_depth(raw) > JSON_MAX_DEPTH):
            return _given_back(request, drf_view)
        checked.append(fields)
    try:
        caller = _Caller(request.META.get("HTTP_AUTHORIZATION"), may_remember=False).row
        _admitted(caller)
        items: list[services.BatchItem | DomainError] = []
        for raw, fields in zip(raw_items, checked, strict=True):
            if fields is None or (
                fields.get("priority") == Priority.CRITICAL and not caller.may_send_critical
            ):
                items.append(item_slow(raw, caller))
            else:
                items.append(
                    services.BatchItem(
                        idempotency_key=fields["idempotency_key"],
                        request=notification_request(fields),
                    )
                )
        outcomes = services.notification_batch_create(
            client_id=caller.client_id, items=items, renderer=NotificationContent()
        )
    except (DomainError, exceptions.APIException) as error:
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
