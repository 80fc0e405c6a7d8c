"""The WSGI application: Django's, with a shortcut for the two create endpoints.

`POST /api/v1/notifications` and `POST /api/v1/notifications/batch` are the API's hot path.
Their thin path (notifications/ingest.py) answers a plainly valid request without DRF; this
module also takes such a request past Django's handler, its signals, URL resolution and
middleware chain, about a third of a create's CPU in one process
(docs/decisions/0001-wsgi-shortcut-for-creates.md). Everything a request met on the long way
and that matters to its answer happens here too, from Django's own pieces:

- the request is Django's `WSGIRequest`, the same object a view gets;
- SecurityMiddleware's redirect to HTTPS and the API guard's refusals (NUL, a body over the
  cap) are checked first: a request either would answer goes the long way, untouched;
- the route's function answers, or gives the request back (None) — anything not plainly
  valid — and it goes the long way with its body as read;
- an exception is answered by Django's `response_for_exception` (its logging, handler500);
- the answer gets the headers of the middleware that set them on the long way (security,
  X-Frame-Options, Content-Length): tests/integration/test_api_shortcut.py holds every
  shortcut answer against the long way's, header for header;
- django-prometheus' request series are recorded as its two middleware record them (`record`);
- the database connection is closed when unusable or older than CONN_MAX_AGE, as Django does
  when a request ends.

The routes come from `settings.API_SHORTCUTS`, a dotted path to a function giving `Shortcuts`:
this lowest layer names no app (as ROOT_URLCONF).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.handlers.exception import response_for_exception
from django.core.handlers.wsgi import WSGIHandler, WSGIRequest
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware
from django.utils.module_loading import import_string

from notifyqueue.middleware import api_request_refusal

# A route's answer, or None: the request goes the long way (through every middleware to the view).
Route = Callable[[HttpRequest], HttpResponse | None]
# Records the request's metrics: request, answer, the view's URL name, perf_counter() at start.
Record = Callable[[HttpRequest, HttpResponse, str, float], None]


@dataclass(frozen=True)
class Shortcut:
    view_name: str  # the URL name, as django-prometheus labels the view
    answer: Route


@dataclass(frozen=True)
class Shortcuts:
    routes: dict[str, Shortcut]  # by PATH_INFO, POST only
    record: Record


def _no_response(request: HttpRequest) -> HttpResponse:
    raise AssertionError("a middleware's process_response was given a get_response call")


class ShortcutApplication:
    """Django's WSGI application, with `Shortcuts` taken before its handler."""

    def __init__(self, django_app: WSGIHandler, shortcuts: Shortcuts) -> None:
        self.django_app = django_app
        self.shortcuts = shortcuts
        self.security = SecurityMiddleware(_no_response)
        self.frame_options = XFrameOptionsMiddleware(_no_response)

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        shortcut = (
            self.shortcuts.routes.get(environ.get("PATH_INFO", ""))
            if environ.get("REQUEST_METHOD") == "POST"
            else None
        )
        if shortcut is None:
            return self.django_app(environ, start_response)
        started = time.perf_counter()
        request = WSGIRequest(environ)
        if self.security.process_request(request) or api_request_refusal(request):
            return self.django_app(environ, start_response)
        try:
            response = shortcut.answer(request)
            # Given back: the body as read (or read now, within the guard's cap) for the long way.
            body = request.body if response is None else b""
        except Exception as exc:  # a body that could not be read, too
            response = response_for_exception(request, exc)
        if response is None:
            environ["wsgi.input"] = io.BytesIO(body)
            return self.django_app(environ, start_response)
        self.security.process_response(request, response)
        self.frame_options.process_response(request, response)
        if not response.has_header("Content-Length"):  # CommonMiddleware
            response.headers["Content-Length"] = str(len(response.content))
        self.shortcuts.record(request, response, shortcut.view_name, started)
        connection.close_if_unusable_or_obsolete()
        start_response(f"{response.status_code} {response.reason_phrase}", list(response.items()))
        return [response.content]


def with_shortcuts(django_app: WSGIHandler) -> ShortcutApplication | WSGIHandler:
    """`django_app` with the shortcuts `settings.API_SHORTCUTS` names (none when unset)."""
    path = getattr(settings, "API_SHORTCUTS", None)
    if not path:
        return django_app
    return ShortcutApplication(django_app, import_string(path)())
