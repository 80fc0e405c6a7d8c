"""The suppression list in the admin: an operator sees it, adds an entry through the same rule
as the API (the counting form, one entry per scope) and removes one, logged."""

from __future__ import annotations

import logging

import pytest
from django.contrib.admin.models import DELETION, LogEntry

from suppressions.models import Reason, Suppression
from suppressions.services import suppression_add
from tests.support.factories import ClientFactory

pytestmark = pytest.mark.django_db

LIST = "/admin/suppressions/suppression/"


def test_an_operator_adds_an_entry_in_its_counting_form_once(superuser):
    client = ClientFactory()
    form = {"channel": "email", "address": "Ada@EXAMPLE.com", "client": str(client.id)}
    response = superuser.post(f"{LIST}add/", form)
    assert response.status_code == 302, response.content[:2000]
    entry = Suppression.objects.get()
    assert (entry.address, entry.client_id, entry.reason, entry.source) == (
        "ada@example.com",
        client.id,
        Reason.OPERATOR,
        "admin ops",
    )
    again = superuser.post(f"{LIST}add/", {**form, "address": "ada@example.com"}, follow=True)
    assert b"already suppressed" in again.content
    assert Suppression.objects.count() == 1


def test_a_bad_address_is_refused_in_the_form(superuser):
    for address in ("not an address", "a@example.com\nBcc: b@example.com", "x" * 5000):
        response = superuser.post(f"{LIST}add/", {"channel": "email", "address": address})
        assert response.status_code == 200  # the form again, with its error
    assert not Suppression.objects.exists()


def test_the_list_shows_entries_and_a_removal_is_logged(superuser, caplog):
    entry, _ = suppression_add(
        channel="sms", recipient="+447700900123", client_id=None, reason="hard_bounce", source="t"
    )
    page = superuser.get(LIST)
    assert page.status_code == 200 and b"+447700900123" in page.content
    with caplog.at_level(logging.WARNING, logger="notifyqueue.suppressions"):
        response = superuser.post(f"{LIST}{entry.id}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Suppression.objects.exists()
    assert any("suppression removed" in r.getMessage() for r in caplog.records)
    assert LogEntry.objects.filter(action_flag=DELETION, object_id=str(entry.id)).exists()


def test_the_receipts_show_on_the_notification_page(superuser):
    from delivery.receipts.models import Receipt
    from tests.support.factories import NotificationFactory

    notification = NotificationFactory(status="SENT")
    Receipt.objects.create(
        channel="email",
        message_id="msg-shown",
        type="complained",
        occurred_at=notification.created_at,
        received_at=notification.created_at,
        event_id="e-1",
        notification=notification,
        client_id=notification.client_id,
    )
    page = superuser.get(f"/admin/notifications/notification/{notification.id}/change/")
    assert page.status_code == 200
    assert b"msg-shown" in page.content
    assert b"delivery receipts" in page.content.lower()
