"""Any provider answer ends as SENT, FAILED or a retry of that one notification: it never
stops a worker or another notification."""

from __future__ import annotations

import pytest

from delivery.models import DeliveryAttempt
from notifications.models import Notification, Status
from tests.faults.harness import (
    Workers,
    all_final,
    notifications_create,
    universal_check,
    wait_until,
)
from tests.support.http_servers import ScriptedProvider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOSTILE = ["hang", "redirect", "longid", "hugeid", "nulid", "garbage", "huge", "reject", "busy"]


def test_hostile_answers_and_4096_character_tokens_end_each_notification_and_stall_nobody(
    database_url, client, webhooks
):
    with ScriptedProvider() as provider, Workers(database_url, provider.url) as workers:
        hostile = notifications_create(client, [f"{kind}@example.com" for kind in HOSTILE])
        plain = notifications_create(client, [f"plain{i}@example.com" for i in range(30)])
        tokens = notifications_create(
            client, [f"{i}" + "t" * 4095 for i in range(3)], channel="push"
        )
        workers.start()
        workers.start()
        wait_until(all_final, timeout_s=90, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    status = {n.recipient.split("@")[0]: n.status for n in Notification.objects.all()}
    assert status["redirect"] == Status.DEAD_LETTERED  # a redirect is never followed
    assert status["reject"] == Status.FAILED
    for kind in set(HOSTILE) - {"redirect", "reject"}:
        assert status[kind] == Status.SENT, kind
    assert counts[Status.SENT] == len(hostile) - 2 + len(plain) + len(tokens)
    assert all(len(provider.sends[f"{n.id}:push"].recipient) == 4096 for n in tokens)

    ids = DeliveryAttempt.objects.exclude(provider_message_id=None)
    assert max(len(a.provider_message_id) for a in ids) <= 1000  # bounded, yet recorded
    errors = " ".join(
        Notification.objects.exclude(last_error=None).values_list("last_error", flat=True)
    )
    assert "busy busy" not in errors  # clients see an error class, not the provider's text
