from django.urls import path

from delivery.views import NotificationAttemptsView

urlpatterns = [
    path(
        "notifications/<uuid:notification_id>/attempts",
        NotificationAttemptsView.as_view(),
        name="notification-attempts",
    ),
]
