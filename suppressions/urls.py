from django.urls import path

from suppressions import views

urlpatterns = [
    path("suppressions", views.SuppressionsView.as_view(), name="suppressions"),
    path(
        "suppressions/<uuid:suppression_id>",
        views.SuppressionView.as_view(),
        name="suppression",
    ),
]
