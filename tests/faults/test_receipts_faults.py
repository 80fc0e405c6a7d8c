"""Receipts and suppressions under fire: signed receipts (with replays and floods) arrive
while `run_worker` processes send, one worker is SIGKILLed mid-batch, and addresses are
suppressed while their notifications wait or are claimed. Every notification still ends
exactly once, and every receipt for a sent message is applied exactly once."""

from __future__ import annotations

import base64
import copy
import json
import signal
import threading
import uuid
from datetime import UTC, datetime

import pytest
from django.db import connections
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from delivery.receipts.models import Receipt
from delivery.upkeep import ReceiptUpkeep
from notifications.models import Notification, Status
from suppressions.models import Reason
from suppressions.services import suppression_add
from tests.faults.harness import (
    Workers,
    all_final,
    notifications_create,
    universal_check,
    wait_until,
)
from tests.support.http_servers import ScriptedProvider
from webhooks.models import WebhookEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def post_receipt(message_id: str, type: str, event_id: str, **fields) -> int:
    raw = json.dumps(
        {"message_id": message_id, "type": type, "timestamp": "2026-12-01T12:00:00Z", **fields}
    ).encode()
    now = datetime.now(UTC)
    response = APIClient().post(
        "/api/v1/providers/email/events",
        raw,
        content_type="application/json",
        HTTP_WEBHOOK_ID=event_id,
        HTTP_WEBHOOK_TIMESTAMP=str(int(now.timestamp())),
        HTTP_WEBHOOK_SIGNATURE=Webhook(SECRET).sign(msg_id=event_id, timestamp=now, data=raw),
    )
    return response.status_code


def test_receipts_and_suppressions_while_workers_send_and_one_is_killed(
    database_url, client, webhooks, settings
):
    providers = copy.deepcopy(settings.NOTIFYQUEUE_PROVIDERS)
    providers["email"]["events_secrets"] = [SECRET]
    settings.NOTIFYQUEUE_PROVIDERS = providers
    with (
        ScriptedProvider(delay_s=0.05) as provider,
        Workers(
            database_url, provider.url, NOTIFYQUEUE_EMAIL_PROVIDER_EVENTS_SECRET=SECRET
        ) as workers,
    ):
        rows = notifications_create(client, [f"user{i}@example.com" for i in range(80)])
        message_ids = {row.id: f"msg-{row.id}:email" for row in rows}
        statuses: list[int] = []

        def providers_report() -> None:
            """Receipts for every message, most before their send is recorded, each sent
            twice (a replay of the same event id), a hard bounce for every tenth."""
            try:
                for n, row in enumerate(rows):
                    kind = {"type": "bounced", "bounce": "hard"} if n % 10 == 0 else {}
                    event_id = f"evt-{uuid.uuid4().hex}"
                    for _ in range(2):
                        statuses.append(
                            post_receipt(
                                message_ids[row.id], kind.pop("type", "delivered"), event_id, **kind
                            )
                        )
                        kind = {"type": "bounced", "bounce": "hard"} if n % 10 == 0 else {}
            finally:
                connections.close_all()

        reporter = threading.Thread(target=providers_report)
        reporter.start()
        first = workers.start()
        workers.start()
        # Suppressed while waiting or claimed: the rows 5, 15, ... end SUPPRESSED or, when
        # their send had passed the suppression stage already, SENT: either, exactly once.
        for n in range(5, 80, 10):
            suppression_add(
                channel="email",
                recipient=rows[n].recipient.upper(),
                client_id=client.id,
                reason=Reason.COMPLAINT,
                source="fault test",
            )
        wait_until(
            lambda: Notification.objects.filter(status=Status.SENT).count() >= 20,
            timeout_s=60,
            what="the first sends",
        )
        first.send_signal(signal.SIGKILL)
        workers.start()
        reporter.join(120)
        wait_until(all_final, timeout_s=120, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    assert set(counts) <= {Status.SENT, Status.SUPPRESSED}
    assert statuses.count(409) == 80  # every replay refused
    assert set(statuses) <= {200, 409}
    ReceiptUpkeep(pending_age_s=3600, seen_age_s=600).run_once()
    bounced = {row.id for n, row in enumerate(rows) if n % 10 == 0}
    for row in Notification.objects.all():
        if row.status == Status.SENT:
            assert row.receipt == ("bounced" if row.id in bounced else "delivered"), row.id
            assert Receipt.objects.filter(notification=row).count() == 1
            receipt_events = WebhookEvent.objects.filter(notification=row).exclude(type="status")
            assert receipt_events.count() == 1
        else:
            assert row.receipt is None
            assert row.last_error.startswith("suppressed: ")
    # The receipts of messages never sent stay pending: nothing was sent for them to match.
    pending = set(
        Receipt.objects.filter(notification__isnull=True).values_list("message_id", flat=True)
    )
    assert pending == {
        message_ids[r.id] for r in Notification.objects.filter(status=Status.SUPPRESSED)
    }
