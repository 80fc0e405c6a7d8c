"""Pages that show the queue's rows never create, edit (or, where it would lose history,
delete) them, even for a superuser."""

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import RequestFactory

from delivery.circuits.models import CircuitBreaker
from delivery.models import DeliveryAttempt, WorkerHeartbeat
from notifications.models import Notification, NotificationDigest
from preferences.models import UserPreferences
from webhooks.models import WebhookEvent

pytestmark = pytest.mark.django_db

NEVER_DELETED = [Notification, NotificationDigest, DeliveryAttempt, WorkerHeartbeat, CircuitBreaker]
VIEW_ONLY = [*NEVER_DELETED, UserPreferences, WebhookEvent]


@pytest.fixture
def superuser_request():
    request = RequestFactory().get("/admin/")
    request.user = User.objects.create_superuser("root", "root@example.com", "pw-123456")
    return request


@pytest.mark.parametrize("model", VIEW_ONLY, ids=lambda m: m.__name__)
def test_no_add_and_no_change(model, superuser_request):
    model_admin = admin.site._registry[model]
    assert not model_admin.has_add_permission(superuser_request)
    assert not model_admin.has_change_permission(superuser_request)
    assert model_admin.has_view_permission(superuser_request)


@pytest.mark.parametrize("model", NEVER_DELETED, ids=lambda m: m.__name__)
def test_no_delete_where_rows_are_the_record(model, superuser_request):
    assert not admin.site._registry[model].has_delete_permission(superuser_request)


def test_inlines_on_a_notification_are_read_only(superuser_request):
    model_admin = admin.site._registry[Notification]
    for inline in model_admin.get_inline_instances(superuser_request):
        assert not inline.has_add_permission(superuser_request, None)
        assert not inline.has_change_permission(superuser_request)
        assert not inline.has_delete_permission(superuser_request)
