from django.urls import path

from notifications import views

urlpatterns = [
    path("notifications", views.NotificationCollectionView.as_view(), name="notification-list"),
    # Before the detail route, which would otherwise read "batch" as an id.
    path("notifications/batch", views.NotificationBatchView.as_view(), name="notification-batch"),
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
]
