from django.urls import path

from preferences import views

urlpatterns = [
    path("users/<str:user_id>/preferences", views.PreferencesView.as_view(), name="preferences"),
    path("users/<str:user_id>/inbox", views.InboxView.as_view(), name="inbox"),
    path(
        "users/<str:user_id>/inbox/<str:message_id>/read",
        views.InboxReadView.as_view(),
        name="inbox-read",
    ),
]
