from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerView,
)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("api/v1/", include("delivery.urls")),
    path("api/v1/", include("notifications.urls")),
    path("", include("health.urls")),
    path("", include("delivery.unsubscribe.urls")),
    path("api/v1/", include("templates.urls")),
    path("api/v1/", include("preferences.urls")),
    path("api/v1/", include("suppressions.urls")),
]

# Under /api/ every error answers in the API's JSON format (notifyqueue/errors.py).
handler400 = "notifyqueue.errors.api_bad_request"
handler404 = "notifyqueue.errors.api_not_found"
handler500 = "notifyqueue.errors.api_server_error"
