"""The one-click unsubscribe page: `GET /unsubscribe/{token}` shows a button and changes
nothing (mail scanners follow links); `POST` with `List-Unsubscribe=One-Click` (RFC 8058:
no credentials, no CSRF token, sent by the mail client itself or by the button) does it."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from delivery.unsubscribe.services import (
    TokenInvalid,
    unsubscribe_apply,
    unsubscribe_token_read,
)

log = logging.getLogger("notifyqueue.unsubscribe")


@csrf_exempt
@require_http_methods(["GET", "POST"])
def unsubscribe_view(request: HttpRequest, token: str) -> HttpResponse:
    try:
        target = unsubscribe_token_read(token)
    except TokenInvalid:
        return render(request, "unsubscribe/invalid.html", status=400)
    if request.method == "GET":
        return render(request, "unsubscribe/confirm.html")
    if request.POST.get("List-Unsubscribe") != "One-Click":
        return render(request, "unsubscribe/invalid.html", status=400)
    changed = unsubscribe_apply(target)
    log.info(
        "unsubscribed client=%s kind=%s changed=%s",
        target.client_id,
        "event" if target.user_id is not None else "address",
        changed,
    )
    return render(request, "unsubscribe/done.html")
