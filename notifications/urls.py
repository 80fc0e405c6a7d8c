from django.urls import path

from notifications import views

urlpatterns = [
    path("notifications", views.notification_collection, name="notification-list"),
    # Before the detail route, which would otherwise read "batch" or "retry" as an id.
    path("notifications/batch", views.notification_batch, name="notification-batch"),
    path(
        "notifications/retry",
        views.NotificationBulkRetryView.as_view(),
        name="notification-retry-bulk",
    ),
    path(
        "notifications/cancel",
        views.NotificationCancelByKeyView.as_view(),
        name="notification-cancel-by-key",
    ),
    path(
        "notifications/<str:notification_id>",
        views.NotificationDetailView.as_view(),
        name="notification-detail",
    ),
    path(
        "notifications/<str:notification_id>/cancel",
        views.NotificationCancelView.as_view(),
        name="notification-cancel",
    ),
    path(
        "notifications/<str:notification_id>/retry",
        views.NotificationRetryView.as_view(),
        name="notification-retry",
    ),
]
