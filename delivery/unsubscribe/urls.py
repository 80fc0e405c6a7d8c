from django.urls import path

from delivery.unsubscribe.views import unsubscribe_view

urlpatterns = [path("unsubscribe/<str:token>", unsubscribe_view, name="unsubscribe")]
