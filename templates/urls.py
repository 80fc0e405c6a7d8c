from django.urls import path

from templates import views

urlpatterns = [
    path("templates/<str:event>/<str:channel>", views.TemplateView.as_view(), name="template"),
]
