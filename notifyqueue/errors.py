"""Errors as the API reports them: `{"error": {"code", "message", "fields"}}` (contract section 3).

Services raise `DomainError` subclasses; views never build error bodies themselves.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler


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
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        headers = getattr(exc, "headers", None)
        return Response(
            error_body(exc.code, exc.message, exc.fields), status=exc.http_status, headers=headers
        )
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
