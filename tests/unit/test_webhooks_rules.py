"""Webhook rules that need neither a database nor a network: body, signing, backoff, URLs.

The address rules themselves are tested in tests/integration/test_outbound.py."""

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.core.exceptions import ValidationError
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from clients.models import webhook_secret_new
from notifyqueue.webhook_url import webhook_url_validate
from webhooks.checks import webhook_settings_check
from webhooks.repositories import QUERIES, ClaimedEvent
from webhooks.services import (
    webhook_event_body,
    webhook_retry_wait_seconds,
    webhook_signature_headers,
    webhook_signing_secrets,
)

NOW = datetime(2026, 9, 24, 12, 1, 3, 654321, tzinfo=UTC)


def claimed(**overrides) -> ClaimedEvent:
    values = {
        "id": uuid.uuid4(),
        "claim_token": uuid.uuid4(),
        "client_id": uuid.uuid4(),
        "notification_id": uuid.uuid4(),
        "status": "SENT",
        "attempt_count": 2,
        "occurred_at": NOW,
        "delivery_attempts": 1,
        "attempt_number": 1,
        "webhook_url": "https://hooks.example.com/notify",
        "webhook_secret": webhook_secret_new(),
        "previous_webhook_secret": "",
        "previous_webhook_secret_expires_at": None,
        "claimed_at": NOW,
    }
    return ClaimedEvent(**{**values, **overrides})


def test_body_is_exactly_the_contract_fields_with_an_rfc3339_utc_timestamp():
    # Stored in any offset, reported in UTC with a Z, whole seconds.
    event = claimed(occurred_at=NOW.astimezone(timezone(timedelta(hours=2))))
    assert json.loads(webhook_event_body(event)) == {
        "eventId": str(event.id),
        "jobId": str(event.notification_id),
        "status": "SENT",
        "attemptCount": 2,
        "timestamp": "2026-09-24T12:01:03Z",
        "type": "status",
    }


def test_a_receipts_event_adds_its_type_receipt_and_message_id():
    event = claimed(type="receipt.bounced", receipt="bounced", message_id="msg-5521")
    assert json.loads(webhook_event_body(event)) == {
        "eventId": str(event.id),
        "jobId": str(event.notification_id),
        "status": "SENT",
        "attemptCount": 2,
        "timestamp": "2026-09-24T12:01:03Z",
        "type": "receipt.bounced",
        "receipt": "bounced",
        "message_id": "msg-5521",
    }


def test_signature_verifies_with_the_standardwebhooks_library():
    event = claimed()
    body = webhook_event_body(event)
    headers = webhook_signature_headers(
        event_id=event.id, body=body, secrets=[event.webhook_secret], sent_at=datetime.now(UTC)
    )
    assert headers["webhook-id"] == str(event.id)
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(event.webhook_secret).verify(body, headers)["eventId"] == str(event.id)
    with pytest.raises(WebhookVerificationError):
        Webhook(webhook_secret_new()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(event.webhook_secret).verify(body.replace(b"SENT", b"FAIL"), headers)


def test_both_secrets_sign_during_the_rotation_overlap_and_only_the_new_one_after():
    old, new = webhook_secret_new(), webhook_secret_new()
    event = claimed(
        webhook_secret=new,
        previous_webhook_secret=old,
        previous_webhook_secret_expires_at=NOW + timedelta(hours=24),
    )
    assert webhook_signing_secrets(event, now=NOW) == [new, old]
    assert webhook_signing_secrets(event, now=NOW + timedelta(hours=24)) == [new]

    body = webhook_event_body(event)
    headers = webhook_signature_headers(
        event_id=event.id,
        body=body,
        secrets=webhook_signing_secrets(event, now=NOW),
        sent_at=datetime.now(UTC),
    )
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(body, headers)
    Webhook(new).verify(body, headers)


STANDARD = [0, 5, 300, 1800, 7200, 18000, 36000, 36000]


@pytest.mark.parametrize(
    "attempt, step", [(1, 5), (2, 300), (3, 1800), (4, 7200), (5, 18000), (6, 36000), (7, 36000)]
)
def test_retry_waits_follow_the_schedule_with_ten_percent_jitter(attempt, step):
    def wait(r):
        return webhook_retry_wait_seconds(attempt=attempt, schedule=STANDARD, rng=lambda: r)

    assert wait(0.0) == pytest.approx(step * 0.9)
    assert wait(0.5) == pytest.approx(step)
    assert wait(1.0) == pytest.approx(step * 1.1)


def test_past_the_schedule_the_last_step_repeats():
    assert webhook_retry_wait_seconds(attempt=50, schedule=STANDARD, rng=lambda: 0.5) == 36000


def test_the_default_schedule_spans_more_than_a_day(settings):
    # Ten attempts by default: nine waits after failures, the last steps repeating.
    schedule = settings.NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE
    assert schedule == STANDARD and settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS == 10
    waits = [
        webhook_retry_wait_seconds(attempt=n, schedule=schedule, rng=lambda: 0.0)
        for n in range(1, settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS)
    ]
    assert sum(waits) > 24 * 3600  # even with every wait at its shortest (-10%)


def test_url_validator_refuses_private_literals_and_other_schemes(settings):
    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = False
    for url in ["ftp://example.com/", "http://10.0.0.5/hook", "http://[::1]/", "http://localhost/"]:
        with pytest.raises(ValidationError):
            webhook_url_validate(url)
    webhook_url_validate("https://hooks.example.com/notify")
    webhook_url_validate("")
    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = True
    webhook_url_validate("http://127.0.0.1:9000/hook")


def test_every_webhook_query_is_loaded():
    assert set(QUERIES) == {
        "webhook_events_step",
        "webhook_events_release",
        "webhook_receipt_events_add",
        "webhook_event_reclaim_expired",
        "webhook_event_redeliver",
    }


@pytest.mark.parametrize(
    "name, value, error",
    [
        ("NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE", [], "webhooks.E001"),
        ("NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE", [0, -5], "webhooks.E001"),
        ("NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY", 0, "webhooks.E002"),
        ("NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS", 5.0, "webhooks.E003"),
    ],
)
def test_bad_webhook_settings_fail_the_start_up_checks(settings, name, value, error):
    assert webhook_settings_check(None) == []
    setattr(settings, name, value)
    assert [e.id for e in webhook_settings_check(None)] == [error]
