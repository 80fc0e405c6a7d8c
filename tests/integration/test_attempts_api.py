"""GET /api/v1/notifications/{id}/attempts."""

import pytest

from delivery.models import Outcome
from delivery.repositories import DeliveryRepository, Finish
from notifications.models import Status
from tests.support.factories import NotificationFactory

pytestmark = pytest.mark.django_db


def test_attempts_lists_each_attempt_with_its_outcome(api, acme):
    notification = NotificationFactory(client=acme[0])
    repo = DeliveryRepository()
    [claim] = repo.notification_claim_due(worker="w1", limit=1, claim_timeout_s=30)
    repo.notification_finish(
        [Finish(claim.id, claim.claim_token, Status.PENDING, Outcome.TEMPORARY_FAILURE, "busy")]
    )
    [claim] = repo.notification_claim_due(worker="w2", limit=1, claim_timeout_s=30)

    response = api.get(f"/api/v1/notifications/{notification.id}/attempts")

    assert response.status_code == 200
    first, second = response.json()
    assert first["number"] == 1 and first["worker"] == "w1"
    assert (first["outcome"], first["error"], first["channel"]) == (
        "TEMPORARY_FAILURE",
        "busy",
        "email",
    )
    assert first["finished_at"] is not None
    assert (second["number"], second["outcome"], second["finished_at"]) == (2, None, None)


def test_attempts_of_another_clients_notification_answer_404(api, make_client):
    other, _ = make_client("other")
    notification = NotificationFactory(client=other)
    response = api.get(f"/api/v1/notifications/{notification.id}/attempts")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_attempts_need_an_api_key(acme):
    from rest_framework.test import APIClient

    notification = NotificationFactory(client=acme[0])
    response = APIClient().get(f"/api/v1/notifications/{notification.id}/attempts")
    assert response.status_code == 401
