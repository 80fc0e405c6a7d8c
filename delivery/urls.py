from django.urls import path

from delivery.receipts.views import NotificationReceiptsView, ProviderEventsView
from delivery.views import NotificationAttemptsView

urlpatterns = [
    path(
        "notifications/<uuid:notification_id>/attempts",
        NotificationAttemptsView.as_view(),
        name="notification-attempts",
    ),
    path(
        "notifications/<uuid:notification_id>/receipts",
        NotificationReceiptsView.as_view(),
        name="notification-receipts",
    ),
    path("providers/<str:channel>/events", ProviderEventsView.as_view(), name="provider-events"),
]
