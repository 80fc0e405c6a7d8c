"""Refusals made before any view runs, for `/api/` requests only (contract: bounds).

- A NUL character in the path, the query string or a header value is a 400: PostgreSQL's
  text cannot hold it, so letting it reach a query would fail there as a 500.
- A Content-Length over DATA_UPLOAD_MAX_MEMORY_SIZE is a 413 before the body is read.
  (A body without a length, or one that lies about it, is cut off by the JSON parser.)
Both answer in the API's JSON error format.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest, HttpResponse

from notifyqueue.errors import API_PREFIX, error_response

NUL_MESSAGE = "NUL characters are not allowed."


class ApiRequestGuardMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIX):
            refusal = api_request_refusal(request)
            if refusal is not None:
                return refusal
        return self.get_response(request)


def api_request_refusal(request: HttpRequest) -> HttpResponse | None:
    """The error answer for a request no view should see, or None."""
    if "\x00" in request.path:
        return _nul("path")
    # %00 is the only spelling of NUL in a query string (a raw NUL cannot be sent).
    if "%00" in request.META.get("QUERY_STRING", ""):
        return _nul("query")
    for name, value in request.META.items():
        if name.startswith("HTTP_") and isinstance(value, str) and "\x00" in value:
            return _nul(name[5:].replace("_", "-").title())
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return error_response(400, "bad_request", "Content-Length is not a number.")
    if limit is not None and length > limit:
        return error_response(
            413, "payload_too_large", f"The request body is larger than {limit} bytes."
        )
    return None


def _nul(where: str) -> HttpResponse:
    return error_response(400, "invalid_request", f"{where}: {NUL_MESSAGE}", {where: [NUL_MESSAGE]})


# The JSON API: every view under it is DRF's, authenticated by API key.
JSON_API_PREFIX = "/api/v1/"


def _browser_only(middleware: type) -> type:
    """`middleware` for the admin and the browser pages only: a request under /api/v1/ passes
    through it untouched. The JSON API authenticates by API key and its views are exempt from
    CSRF, so sessions, Django's user and messages mean nothing there, and setting them up cost
    a fifth of a create's CPU in the API, with CSRF's."""

    class BrowserOnly(middleware):
        def __call__(self, request: HttpRequest) -> HttpResponse:
            if request.path_info.startswith(JSON_API_PREFIX):
                return self.get_response(request)
            return super().__call__(request)

    BrowserOnly.__name__ = BrowserOnly.__qualname__ = f"BrowserOnly{middleware.__name__}"
    return BrowserOnly


BrowserOnlySessionMiddleware = _browser_only(SessionMiddleware)
BrowserOnlyAuthenticationMiddleware = _browser_only(AuthenticationMiddleware)
BrowserOnlyMessageMiddleware = _browser_only(MessageMiddleware)
