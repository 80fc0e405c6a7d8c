from django.urls import path

from health.views import metrics_view, status_view

urlpatterns = [
    path("status", status_view, name="status"),
    path("metrics", metrics_view, name="metrics"),
]
