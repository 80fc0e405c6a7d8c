"""Errors as the API reports them: `{"error": {"code", "message", "fields"}}` (contract section 3).

Services raise `DomainError` subclasses; views never build error bodies themselves. Errors
that happen outside DRF's views (an unknown URL, a body too large to read, an unexpected
exception) reach Django's error handlers, which answer in the same format under `/api/`
(`api_not_found`, `api_bad_request`, `api_server_error`, wired in notifyqueue/urls.py).
"""

from __future__ import annotations

import sys
from typing import Any

import psycopg
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response

from notifyqueue.vocabulary import LONE_SURROGATE

API_PREFIX = "/api/"


class DomainError(Exception):
    """A rule was broken; carries what the API should answer."""

    code = "invalid"
    http_status = status.HTTP_400_BAD_REQUEST

    def __init__(self, message: str, *, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields or {}


class InvalidRequest(DomainError):
    code = "invalid_request"


class NotFound(DomainError):
    code = "not_found"
    http_status = status.HTTP_404_NOT_FOUND


class Conflict(DomainError):
    code = "conflict"
    http_status = status.HTTP_409_CONFLICT


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """The error answer. An error may quote what the client sent (an unknown field's name, a
    key), and JSON can carry a lone surrogate (`"\\ud800"`) that UTF-8 cannot: such text is
    answered escaped, so every error can be written."""
    return {
        "error": {"code": code, "message": _encodable(message), "fields": _encodable(fields or {})}
    }


def _encodable(value: Any) -> Any:
    if isinstance(value, str):
        if value.isascii() or LONE_SURROGATE.search(value) is None:
            return value
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(key): _encodable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_encodable(item) for item in value]
    return value


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        headers = getattr(exc, "headers", None)
        return Response(
            error_body(exc.code, exc.message, exc.fields), status=exc.http_status, headers=headers
        )
    # Imported here: rest_framework.views builds APIView from the REST_FRAMEWORK settings,
    # whose classes (parser, throttle) import this module.
    from rest_framework.views import exception_handler

    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        response.data = error_body("invalid_request", _first_message(fields), fields)
    else:
        code = exc.default_code if isinstance(exc, exceptions.APIException) else "error"
        detail = response.data.get("detail", str(exc)) if isinstance(response.data, dict) else exc
        response.data = error_body(code, str(detail))
    return response


def _first_message(fields: Any) -> str:
    """A one-line summary naming the first offending field."""
    if isinstance(fields, dict):
        for name, errors in fields.items():
            return f"{name}: {_first_message(errors)}"
    if isinstance(fields, list) and fields:
        return _first_message(fields[0])
    return str(fields) or "Invalid request."


def error_response(
    http_status: int, code: str, message: str, fields: dict[str, Any] | None = None
) -> JsonResponse:
    """An error in the API's format, for code that runs outside DRF (middleware, handlers)."""
    return JsonResponse(error_body(code, message, fields), status=http_status)


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def api_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: under /api/, a JSON 404 for an unknown route (a trailing slash included)."""
    if not _is_api(request):
        return defaults.page_not_found(request, exception)
    return error_response(404, "not_found", f"No such endpoint: {request.method} {request.path}.")


def api_bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler400: Django's own refusals (a body over DATA_UPLOAD_MAX_MEMORY_SIZE, a bad
    Host header...) in the API's format; an oversized body is a 413."""
    if isinstance(exception, RequestDataTooBig):
        if _is_api(request):
            return error_response(413, "payload_too_large", "The request body is too large.")
        return HttpResponse("Request body too large.", status=413, content_type="text/plain")
    if not _is_api(request):
        return defaults.bad_request(request, exception)
    return error_response(400, "bad_request", "The request could not be read.")


# The request's database session was lost or refused (terminated, restarted, out of
# connections, a deadlock or timeout it was cancelled for). The same request sent again can
# succeed; a session lost after its commit but before the answer may have written it, so a
# create is sent again with the same idempotency key (answered as a replay).
_DATABASE_UNAVAILABLE = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
RETRY_AFTER_S = 1


def api_server_error(request: HttpRequest) -> HttpResponse:
    """handler500: under /api/, a JSON 500 that says nothing about the failure (the traceback
    is in the server's log, under the `django.request` logger), or a 503 with `Retry-After`
    when the request lost its database session: a client retries that, with the same
    idempotency key."""
    if not _is_api(request):
        return defaults.server_error(request)
    if isinstance(sys.exc_info()[1], _DATABASE_UNAVAILABLE):
        response = error_response(
            503, "database_unavailable", "The database could not be reached; try again."
        )
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
    return error_response(500, "server_error", "Something went wrong on our side.")
